//! Non-linear protocols on additive shares, built on OT.
