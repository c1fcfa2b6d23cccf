import { execFileSync } from 'node:child_process';

/**
 * Why the alert-rule tests cannot run here (promtool, from Debian's `prometheus` package, is not
 * installed), or false. On CI a missing promtool is a failure: .ci/run installs it.
 */
export const promtoolMissing: string | false = (() => {
  try {
    execFileSync('promtool', ['--version'], { stdio: 'ignore' });
    return false;
  } catch {
    return 'promtool is not installed (apt-get install prometheus)';
  }
})();
if (promtoolMissing && process.env.CI) throw new Error(`${promtoolMissing}: .ci/run installs it`);
