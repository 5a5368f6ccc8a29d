//! veil-private's serving tests — deadlines, refusals and the reasons a server closes a
//! session with — in one test binary. Their timing bounds are loose enough for tests running
//! beside each other; the soak tests, which count the process's threads, keep binaries of
//! their own.

// The soak tests' log capture and thread count are not used here.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

mod client_limits;
mod refusals;
mod session_close;
