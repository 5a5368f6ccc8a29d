//! Linear protocols on additive shares, built on BFV: Π_MatMul, FC layers, cross terms.

pub mod layout;
pub mod matmul;
pub mod session;

pub use layout::{Blocking, Layout};
pub use matmul::{PreparedMatrix, ServerJob};
pub use session::{ClientSession, ServerSession};
pub mod cross;
pub mod fc;

pub use cross::{shared_matmul_client, shared_matmul_server};
pub use fc::{fc_client, fc_server, FcLayer, PreparedFc};
pub mod bench;
