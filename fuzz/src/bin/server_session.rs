//! A whole server session against arbitrary client bytes: hello, key set-up, base OTs,
//! silent-COT bootstrap, requests and every protocol message of an inference. Any error is
//! fine; a panic or a hang is a finding.

use std::panic::AssertUnwindSafe;

use veil_private::ServerModel;

fn serve(server: &AssertUnwindSafe<ServerModel>, data: &[u8]) {
    let _ = veil_private::serve_session(veil_net::Replay::new(data.to_vec()), &server.0);
}

fn main() {
    // The model is only read; a panic inside a session leaves nothing half-updated in it.
    let server = AssertUnwindSafe(veil_fuzz::small_server());
    let server = &server;
    afl::fuzz!(|data: &[u8]| serve(server, data));
}
