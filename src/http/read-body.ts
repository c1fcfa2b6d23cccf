import type { IncomingMessage, ServerResponse } from 'node:http';
import { HttpError } from '../errors.js';
import { closeAfterAnswer, continueIfExpected } from './listener.js';

/**
 * Reads the body up to `limit` bytes within `timeoutMs`. Past the limit (declared or actual) it
 * stops reading at once: 413, and the connection is closed rather than drained.
 */
export function readBody(req: IncomingMessage, res: ServerResponse, limit: number, timeoutMs: number): Promise<Buffer> {
  // The rest of the body is never read: tell the client, and close once the answer is out.
  const abandonBody = () => closeAfterAnswer(res);
  const declared = Number(req.headers['content-length'] ?? NaN);
  if (declared > limit) {
    abandonBody();
    return Promise.reject(new HttpError('payload_too_large', `content-length ${declared} > ${limit}`));
  }
  continueIfExpected(res); // the checks before the body passed: the client may send it now
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const finish = (error: HttpError | undefined) => {
      clearTimeout(timer);
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      if (!error) return resolve(Buffer.concat(chunks));
      abandonBody();
      reject(error);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) return finish(new HttpError('payload_too_large', `body over ${limit} bytes`));
      chunks.push(chunk);
    };
    const onEnd = () => finish(undefined);
    const onError = (err: Error) => finish(new HttpError('request_timeout', `body aborted: ${err.message}`));
    const timer = setTimeout(
      () => finish(new HttpError('request_timeout', `body not complete after ${timeoutMs} ms`)),
      timeoutMs,
    );
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
  });
}
