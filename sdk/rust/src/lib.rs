//! qftrio's Rust SDK: [`Client`], a typed method per route of the API, and
//! [`Worker`], which runs the whole worker loop (leasing, lanes, heartbeats,
//! reports, retries, shutdown) around your handlers. See docs/sdk-rust.md.

mod client;
mod error;
#[doc(hidden)]
pub mod routes;
mod types;
mod worker;

pub use client::{Client, EventStream, EventsFilter, StreamEvent};
pub use error::{BoxError, Error, Result};
pub use types::*;
pub use worker::{Event, EventKind, HandlerResult, JobContext, OnEvent, Worker, WorkerOptions};
