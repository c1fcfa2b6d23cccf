import { execFileSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/**
 * A throwaway certificate authority made with the openssl CLI (`openssl ca`, so certificates can
 * carry past dates and be revoked, and CRLs are real ones): for client certificates (mTLS) tests.
 */
export interface TestCa {
  name: string;
  /** The CA certificate's PEM file (what `gateway.tls.clientCertificates.ca` names). */
  certFile: string;
  /** Issues a client certificate (EC P-256 key, serial from the CA's database). */
  issue(name: string, options?: IssueOptions): TestClientCertificate;
  /** Marks a certificate revoked in the CA's database (`crl()` then lists it). */
  revoke(cert: TestClientCertificate): void;
  /** A CRL signed by the CA listing what is revoked so far, as a PEM file `name`.pem. */
  crl(name: string, options?: { days?: number }): string;
}

export interface IssueOptions {
  cn?: string;
  /** SAN entries as openssl writes them: `URI:spiffe://corp/ns/billing/sa/api`, `DNS:orders.internal`. */
  san?: string[];
  /** extendedKeyUsage; default `clientAuth`. */
  extendedKeyUsage?: string;
  /** `YYYYMMDDHHMMSSZ`; default now. */
  startDate?: string;
  /** `YYYYMMDDHHMMSSZ`; default in 30 days. */
  endDate?: string;
}

export interface TestClientCertificate {
  certFile: string;
  keyFile: string;
  cert: Buffer;
  key: Buffer;
  /** SHA-256 of the DER, lowercase hex without colons (what X-Gatehouse-Client-Cert-Sha256 carries). */
  sha256: string;
}

function openssl(args: string[], cwd: string): void {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A new CA in `dir/<name>/`: its key, certificate (10 years), database and serial file. */
export function createTestCa(dir: string, name: string): TestCa {
  const home = path.join(dir, name);
  mkdirSync(home, { recursive: true });
  writeFileSync(path.join(home, 'index.txt'), '');
  writeFileSync(path.join(home, 'serial'), '1000\n');
  writeFileSync(path.join(home, 'crlnumber'), '1000\n');
  writeFileSync(
    path.join(home, 'ca.cnf'),
    [
      '[ca]',
      'default_ca = test_ca',
      '[test_ca]',
      `dir = ${home}`,
      'database = $dir/index.txt',
      'serial = $dir/serial',
      'crlnumber = $dir/crlnumber',
      'new_certs_dir = $dir',
      'certificate = $dir/ca.pem',
      'private_key = $dir/ca.key',
      'default_md = sha256',
      'default_days = 30',
      'default_crl_days = 30',
      'policy = any_name',
      'unique_subject = no',
      'copy_extensions = none',
      '[any_name]',
      'commonName = optional',
      '',
    ].join('\n'),
  );
  openssl(
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      'ca.key',
      '-out',
      'ca.pem',
      '-days',
      '3650',
      '-subj',
      `/CN=${name}`,
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ],
    home,
  );
  const config = path.join(home, 'ca.cnf');
  return {
    name,
    certFile: path.join(home, 'ca.pem'),
    issue(client, options = {}) {
      const ext = path.join(home, `${client}.ext`);
      writeFileSync(
        ext,
        [
          '[client]',
          'basicConstraints = critical,CA:FALSE',
          'keyUsage = critical,digitalSignature',
          `extendedKeyUsage = ${options.extendedKeyUsage ?? 'clientAuth'}`,
          // A section, one entry a line: a value may then hold ", " (an entry that poses as two).
          ...(options.san?.length
            ? [
                'subjectAltName = @names',
                '[names]',
                ...options.san.map(
                  (entry, i) => `${entry.slice(0, entry.indexOf(':'))}.${i} = ${entry.slice(entry.indexOf(':') + 1)}`,
                ),
              ]
            : []),
          '',
        ].join('\n'),
      );
      const subject = options.cn === undefined ? '/' : `/CN=${options.cn}`;
      openssl(
        [
          'req',
          '-new',
          '-newkey',
          'ec',
          '-pkeyopt',
          'ec_paramgen_curve:P-256',
          '-nodes',
          '-keyout',
          `${client}.key`,
          '-out',
          `${client}.csr`,
          '-subj',
          subject,
        ],
        home,
      );
      openssl(
        [
          'ca',
          '-batch',
          '-notext',
          '-config',
          config,
          '-in',
          `${client}.csr`,
          '-out',
          `${client}.pem`,
          '-extfile',
          ext,
          '-extensions',
          'client',
          ...(options.startDate ? ['-startdate', options.startDate] : []),
          ...(options.endDate ? ['-enddate', options.endDate] : []),
        ],
        home,
      );
      const certFile = path.join(home, `${client}.pem`);
      const keyFile = path.join(home, `${client}.key`);
      const cert = readFileSync(certFile);
      return {
        certFile,
        keyFile,
        cert,
        key: readFileSync(keyFile),
        sha256: new X509Certificate(cert).fingerprint256.replaceAll(':', '').toLowerCase(),
      };
    },
    revoke(cert) {
      openssl(['ca', '-config', config, '-revoke', cert.certFile], home);
    },
    crl(file, options = {}) {
      const out = path.join(home, `${file}.pem`);
      openssl(['ca', '-config', config, '-gencrl', '-crldays', String(options.days ?? 30), '-out', out], home);
      return out;
    },
  };
}
