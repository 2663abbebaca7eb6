/**
 * One error tree, as the Python client's:
 *
 *     QftrioError
 *     ├── ApiError          the server answered 4xx/5xx: `status` and `code`
 *     ├── TransportError    no answer: connection refused or broken, timeout
 *     ├── UnexpectedAnswer  an answer that is not qftrio's (another service at the URL)
 *     ├── ConfigError       an argument that can never work (a bad URL, lanes 0, ...)
 *     └── PermanentError    thrown by a handler: fail the job without retry
 */

export class QftrioError extends Error {
  override name = "QftrioError";
}

/** The server answered with an error status. `code` is the error body's
 * code (`not_found`, `lease_lost`, `invalid`, ...), `null` when the answer
 * had no qftrio error body (a proxy's page, say). */
export class ApiError extends QftrioError {
  override name = "ApiError";
  constructor(
    readonly status: number,
    readonly code: string | null,
    message: string,
  ) {
    super(`${status}${code ? ` ${code}` : ""}: ${message}`);
  }
}

/** No answer: the server could not be reached, the connection broke, or the
 * call timed out. Sending the call again may succeed. */
export class TransportError extends QftrioError {
  override name = "TransportError";
}

/** What answered is not a qftrio server: not JSON, or not of the shape the
 * route answers. */
export class UnexpectedAnswer extends QftrioError {
  override name = "UnexpectedAnswer";
}

/** An option or argument that can never work; thrown before anything is sent. */
export class ConfigError extends QftrioError {
  override name = "ConfigError";
}

/** Thrown by a handler: the job fails with `retryable: false` (dead-lettered
 * at once) and the error's message. */
export class PermanentError extends QftrioError {
  override name = "PermanentError";
}
