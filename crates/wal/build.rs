//! Declares the `loom` cfg so `cargo test` with `RUSTFLAGS="--cfg loom"` runs the loom model
//! test and ordinary builds do not warn about an unknown cfg.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
