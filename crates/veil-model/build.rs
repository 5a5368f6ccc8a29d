//! `VEIL_WITHOUT_BUILT_IN_MODELS=1 cargo build …` leaves the built-in models' overlays (≈ 48 MB)
//! out of the binary: a benchmark binary small enough to carry to another host. Such a binary
//! refuses the built-in models by name with a clear error.
fn main() {
    println!("cargo::rerun-if-env-changed=VEIL_WITHOUT_BUILT_IN_MODELS");
    println!("cargo::rustc-check-cfg=cfg(veil_without_built_in_models)");
    if std::env::var_os("VEIL_WITHOUT_BUILT_IN_MODELS").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=veil_without_built_in_models");
    }
}
