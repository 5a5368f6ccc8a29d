//! The harness of Veil's tests that need something from outside the repository: the package
//! registry (real weights fetched with pip, `veil_model::fetch`) or the project's shared data
//! (`veil_model::data::shared_dataset`).
//!
//! A built-in `#[test]` can only pass or fail, so one that returned early for want of its
//! resource was counted as passed. These tests run under libtest-mimic instead (`harness =
//! false` in their crate's `Cargo.toml`): a trial whose resource is missing is counted as
//! *ignored*, with the reason, in cargo's summary line (`3 passed; 0 failed; 1 ignored`). Under
//! CI (`CI` set and not empty) a missing resource fails the trial instead, since a green CI run
//! must mean the real thing was tested.
//!
//! Each trial asks for its resource when it runs (test files keep the answer in a `OnceLock`,
//! so it is decided once per process), so listing or filtering the tests fetches nothing.
//!
//! It also holds the fixtures the protocol crates' tests share: [`two_party`] runs both parties
//! of a protocol in one test.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod two_party;

use std::fmt::Display;

pub use libtest_mimic::Trial;
use libtest_mimic::{Arguments, Completion, Failed};

/// Why a resource a test needs is not available (e.g. "PyPI unreachable while fetching …").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing(pub String);

/// The resource in `result`. An error `is_missing` recognises (the registry cannot be reached)
/// becomes [`Missing`]; any other error panics, so the trial fails rather than being skipped.
pub fn available<T, E: Display>(
    result: Result<T, E>,
    is_missing: impl FnOnce(&E) -> bool,
) -> Result<T, Missing> {
    match result {
        Ok(resource) => Ok(resource),
        Err(e) if is_missing(&e) => Err(Missing(e.to_string())),
        Err(e) => panic!("{e}"),
    }
}

/// A trial named `name` that runs `test` on the resource `need` provides; when `need` reports
/// it missing, the trial is ignored with the reason (failed under CI).
pub fn needs<T>(
    name: &str,
    need: impl FnOnce() -> Result<T, Missing> + Send + 'static,
    test: impl FnOnce(T) + Send + 'static,
) -> Trial {
    Trial::ignorable_test(name, move || match need() {
        Ok(resource) => {
            test(resource);
            Ok(Completion::Completed)
        }
        Err(missing) => on_missing(missing, under_ci()),
    })
}

/// Runs `trials` with the arguments `cargo test` passed and exits with their verdict.
pub fn run(trials: Vec<Trial>) -> ! {
    libtest_mimic::run(&Arguments::from_args(), trials).exit()
}

fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// The verdict on a trial whose resource is missing.
fn on_missing(missing: Missing, ci: bool) -> Result<Completion, Failed> {
    if ci {
        Err(format!("required under CI but unavailable: {}", missing.0).into())
    } else {
        Ok(Completion::ignored_with(missing.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_resource_is_ignored_with_its_reason_and_fails_under_ci() {
        let missing = || Missing("shared/data/sst2 not found".into());
        match on_missing(missing(), false) {
            Ok(Completion::Ignored { reason }) => {
                assert_eq!(reason.as_deref(), Some("shared/data/sst2 not found"))
            }
            _ => panic!("outside CI a missing resource must be ignored"),
        }
        let Err(failed) = on_missing(missing(), true) else {
            panic!("under CI a missing resource must fail")
        };
        assert_eq!(
            failed.message(),
            Some("required under CI but unavailable: shared/data/sst2 not found")
        );
    }

    #[test]
    fn only_recognised_errors_count_as_missing() {
        let unreachable = |e: &&str| e.starts_with("unreachable");
        assert_eq!(available(Ok::<_, &str>(7), unreachable), Ok(7));
        assert_eq!(
            available(Err::<u8, _>("unreachable: no route"), unreachable),
            Err(Missing("unreachable: no route".into()))
        );
        let other = std::panic::catch_unwind(|| available(Err::<u8, _>("corrupt"), unreachable));
        assert!(other.is_err(), "any other error must fail the trial");
    }
}
