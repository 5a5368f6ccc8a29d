//! The session's message decoders (`veil_private::protocol`) on arbitrary bytes, the hello
//! first: each must return a clean error or a message that encodes back to the same bytes.

use veil_private::protocol::{
    DecoderAdmission, EmbeddingLookup, GenerateReply, GenerationRequest, Hello, Message,
    PreprocessReply, Request,
};

fn canonical<M: Message>(data: &[u8]) {
    if let Ok(m) = M::decode(data) {
        assert_eq!(m.encode(), data, "{} has a second encoding", M::WHAT);
    }
}

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let _ = Hello::recv(&mut veil_net::Replay::new(data.to_vec()));
        canonical::<Hello>(data);
        canonical::<Request>(data);
        canonical::<EmbeddingLookup>(data);
        canonical::<PreprocessReply>(data);
        canonical::<GenerationRequest>(data);
        canonical::<GenerateReply>(data);
        canonical::<DecoderAdmission>(data);
        let _ = veil_private::protocol::Admission::decode(data);
    });
}
