//! The exporter-toolkit web config parser on arbitrary text: never panics; a rejection names the
//! file (and, for YAML errors, a line and column).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) =
        gpu_steward::http::web_config::parse(std::path::Path::new("/fuzz/web.yml"), text)
    {
        assert!(e.starts_with("/fuzz/web.yml"), "{e}");
        assert!(e.len() > "/fuzz/web.yml: ".len(), "{e}");
    }
});
