//! Flags other exporters take, which an operator types from habit: clap would only say the
//! flag is unexpected. `--port N` (many exporters) and `--web.listen-address ADDR` (the
//! Prometheus exporters' toolkit) become a message naming `--listen`, which takes `:PORT` too.

/// The message for a habit flag among `args` (the command line without the program name), or
/// `None`.
pub fn foreign_listen_flag(args: &[String]) -> Option<String> {
    for (i, a) in args.iter().enumerate() {
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (a.as_str(), args.get(i + 1).cloned()),
        };
        let addr = match flag {
            "--port" | "-port" => value.map(|v| format!(":{v}")),
            "--web.listen-address" | "-web.listen-address" => value,
            _ => continue,
        };
        let example = addr.unwrap_or_else(|| ":9400".into());
        return Some(format!(
            "gpu-steward: there is no {flag}; the listen address is --listen ADDR (or \
             GPU_STEWARD_LISTEN, or [server] listen), e.g. --listen {example} (':PORT' is every \
             IPv4 address, '127.0.0.1:PORT' loopback only)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn port_and_web_listen_address_point_to_listen_with_the_value() {
        let m = foreign_listen_flag(&args("run --port 9500")).expect("a message");
        assert!(
            m.contains("there is no --port") && m.contains("--listen :9500"),
            "{m}"
        );
        let m = foreign_listen_flag(&args("demo --web.listen-address=127.0.0.1:9500"))
            .expect("a message");
        assert!(m.contains("--listen 127.0.0.1:9500"), "{m}");
        assert_eq!(foreign_listen_flag(&args("run --listen :9500")), None);
    }

    #[test]
    fn a_colon_port_is_a_listen_address() {
        assert_eq!(
            crate::config::parse_listen(":9500"),
            Ok(std::net::SocketAddr::from(([0, 0, 0, 0], 9500)))
        );
        assert!(crate::config::parse_listen(":x").is_err());
    }
}
