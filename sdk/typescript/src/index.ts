export { Client, type CallOptions, type ClientOptions } from "./client.js";
export {
  ApiError,
  ConfigError,
  PermanentError,
  QftrioError,
  RetryIn,
  Snooze,
  TransportError,
  UnexpectedAnswer,
} from "./errors.js";
export { ROUTES, type Route, type RouteName } from "./routes.js";
export type * from "./types.js";
export {
  runWorker,
  type Handler,
  type JobContext,
  type WorkerEvent,
  type WorkerEventType,
  type WorkerOptions,
} from "./worker.js";
