//! The server's first decoder: the client's hello (magic, version, longest prompt).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let mut ch = veil_net::Replay::new(data.to_vec());
        let _ = veil_private::session::read_hello(&mut ch);
    });
}
