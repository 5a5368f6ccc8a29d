//! veil-model's tests that need something from outside the repository (real weights from the
//! package registry, the shared data sets), in one test binary run by `veil_test_harness`: a
//! trial whose resource is missing is ignored with the reason, and fails under CI.

mod real_decoder;
mod real_decoder_numerics;
mod real_weights;
mod shared_data;

fn main() {
    veil_test_harness::run(
        [
            real_decoder::trials(),
            real_decoder_numerics::trials(),
            real_weights::trials(),
            shared_data::trials(),
        ]
        .into_iter()
        .flatten()
        .collect(),
    )
}
