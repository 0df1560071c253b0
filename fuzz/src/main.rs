//! libFuzzer entry point: runs the `tributary-fuzz` target named by `TRIBUTARY_FUZZ_TARGET`
//! (scripts/fuzz sets it). No target logic lives here.

#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use tributary_fuzz::Target;

static TARGET: LazyLock<&'static Target> = LazyLock::new(|| {
    let name = std::env::var("TRIBUTARY_FUZZ_TARGET").unwrap_or_default();
    tributary_fuzz::target(&name).unwrap_or_else(|| {
        let names: Vec<&str> = tributary_fuzz::TARGETS.iter().map(|t| t.name).collect();
        panic!("TRIBUTARY_FUZZ_TARGET={name:?} is not one of {names:?}")
    })
});

fuzz_target!(|data: &[u8]| TARGET.run(data));
