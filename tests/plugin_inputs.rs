//! The device plugin against what comes from outside it. Its socket against a hostile local
//! client that writes HTTP/2 by hand (the attacker's side: no client library would send
//! these): an HPACK bomb, a CONTINUATION flood, a 16 MiB frame. Each is refused by the
//! connection, the agent's peak memory stays within a bound, `/livez` keeps answering and a
//! well-behaved client is served afterwards. What the socket does with the `:authority` values
//! clients send (`localhost` from the kubelet). And CDI spec files that are no specs: a link
//! to `/dev/zero`, a FIFO, a huge file, a deeply nested one.
//!
//! The raw frames follow RFC 9113 §4 and the header blocks RFC 7541 (HPACK); the settings the
//! plugin advertises are those of `src/sharing/plugin/mod.rs` (16 KiB frames, 16 KiB header
//! lists, a 4 KiB header table).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fake_grpc::{self, Unary};
use common::{wait_for, Agent};
use gpu_steward::grpc;
use gpu_steward::sharing::plugin::proto::*;
use tonic::codegen::http;
use tonic::codegen::tokio_stream::StreamExt;

/// The bound on the agent's peak memory growth during one attack.
const RSS_BOUND_KIB: u64 = 64 * 1024;

struct Registration;

impl Unary for Registration {
    const SERVICE: &'static str = "v1beta1.Registration";
    type Request = RegisterRequest;
    type Response = Empty;
}

/// An agent serving the device plugin for two GPUs, with a fake kubelet to register with.
struct Plugin {
    agent: Agent,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

fn start() -> Plugin {
    start_with(tempfile::tempdir().expect("tempdir"), "")
}

/// [`start`] in `dir`, with `more` added to `[sharing.device_plugin]`.
fn start_with(dir: tempfile::TempDir, more: &str) -> Plugin {
    let dp = dir.path().join("device-plugins");
    std::fs::create_dir(&dp).expect("mkdir");
    fake_grpc::serve::<Registration>(&dp.join("kubelet.sock"), Empty {});
    let scenario = "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\ncount = 2\n";
    let config = format!(
        "[sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\n{more}",
        dp.display()
    );
    let agent = Agent::with_scenario(scenario).config(&config).start();
    let socket = dp.join("gpu-steward-gpu.sock");
    wait_for("the plugin socket", Duration::from_secs(20), || {
        socket.exists().then_some(())
    });
    let plugin = Plugin {
        agent,
        socket,
        _dir: dir,
    };
    plugin.assert_serves_a_fresh_client();
    plugin
}

impl Plugin {
    /// A real gRPC client (tonic, `:authority` of its own) gets both GPUs from ListAndWatch.
    fn assert_serves_a_fresh_client(&self) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let channel = grpc::connect(&self.socket, Some(Duration::from_secs(5)))
                .await
                .expect("connect to the plugin");
            let mut client = tonic::client::Grpc::new(channel);
            client.ready().await.expect("ready");
            let codec: tonic::codec::ProstCodec<Empty, ListAndWatchResponse> = Default::default();
            let mut stream = client
                .server_streaming(
                    tonic::Request::new(Empty {}),
                    http::uri::PathAndQuery::from_static(LIST_AND_WATCH_PATH),
                    codec,
                )
                .await
                .expect("ListAndWatch")
                .into_inner();
            let msg = tokio::time::timeout(Duration::from_secs(20), stream.next())
                .await
                .expect("a device list in time")
                .expect("stream open")
                .expect("message");
            assert_eq!(msg.devices.len(), 2, "{:?}", msg.devices);
        });
    }

    /// `field` (`VmRSS`, `VmHWM`) of the agent in KiB, from /proc/<pid>/status.
    fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.agent.child.id()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    /// Runs `attack`, then checks that the agent's peak resident memory grew by less than the
    /// bound (the peak is reset first, so a spike that was freed again still counts), that
    /// `/livez` answers and that a fresh client is served.
    fn survives(&self, what: &str, attack: impl FnOnce(&Path)) {
        let before = self.memory_kib("VmRSS");
        // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux ≥ 4.0).
        std::fs::write(format!("/proc/{}/clear_refs", self.agent.child.id()), b"5")
            .expect("reset the agent's peak RSS");
        attack(&self.socket);
        let peak = self.memory_kib("VmHWM");
        assert!(
            peak < before + RSS_BOUND_KIB,
            "{what}: the agent's peak RSS went from {before} KiB to {peak} KiB"
        );
        assert_eq!(self.agent.get("/livez").status, 200, "{what}: /livez");
        self.assert_serves_a_fresh_client();
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// RFC 9113 §7 error codes.
const PROTOCOL_ERROR: u32 = 0x1;
const FRAME_SIZE_ERROR: u32 = 0x6;

/// An HPACK integer with an `n`-bit prefix whose other bits are `first` (RFC 7541 §5.1).
fn hpack_int(first: u8, n: u32, mut value: usize, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2).
fn literal(name: &str, value: &[u8], out: &mut Vec<u8>) {
    out.push(0);
    hpack_int(0, 7, name.len(), out);
    out.extend_from_slice(name.as_bytes());
    hpack_int(0, 7, value.len(), out);
    out.extend_from_slice(value);
}

/// The request headers of GetDevicePluginOptions with `authority`.
fn request_headers(authority: &str) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", OPTIONS_PATH),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        literal(n, v.as_bytes(), &mut block);
    }
    block
}

/// A connection with the preface and an empty SETTINGS frame written.
fn connect(socket: &Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect to the plugin socket");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    // A server that stops reading must not hang the attacker's loop.
    s.set_write_timeout(Some(Duration::from_secs(10)))
        .expect("write timeout");
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    s.write_all(&out).expect("write the preface");
    s
}

/// How the server ended what the client started on stream 1.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// A DATA frame on stream 1: the answer's message.
    Answer(Vec<u8>),
    /// RST_STREAM on stream 1 with this error code.
    Reset(u32),
    /// GOAWAY with this error code.
    GoAway(u32),
    /// The connection closed (or failed) without either.
    Closed,
}

/// Reads frames until the server answers, resets the stream, goes away or closes.
fn outcome(s: &mut UnixStream) -> Outcome {
    loop {
        let mut h = [0u8; 9];
        if s.read_exact(&mut h).is_err() {
            return Outcome::Closed;
        }
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).is_err() {
            return Outcome::Closed;
        }
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let code = |at: usize| {
            payload
                .get(at..at + 4)
                .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        };
        match (h[3], stream) {
            (SETTINGS, 0) if h[4] & 1 == 0 => {
                // Unacknowledged settings would stop the server; an ack that cannot be
                // written means the connection is gone, which the next read says.
                let _ = s.write_all(&frame(SETTINGS, 1, 0, &[]));
            }
            (DATA, 1) => return Outcome::Answer(payload),
            (RST_STREAM, 1) => return Outcome::Reset(code(0)),
            (GOAWAY, _) => return Outcome::GoAway(code(4)),
            _ => {}
        }
    }
}

/// GetDevicePluginOptions with `:authority` `authority`.
fn options_with_authority(socket: &Path, authority: &str) -> Outcome {
    let mut s = connect(socket);
    let mut out = frame(HEADERS, END_HEADERS, 1, &request_headers(authority));
    // An empty gRPC message: not compressed, length 0.
    out.extend(frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]));
    s.write_all(&out).expect("write the request");
    outcome(&mut s)
}

/// Writes `block` as a header block on stream 1: HEADERS then CONTINUATION frames of at most
/// 16 KiB (the advertised frame size), the last one with END_HEADERS.
fn write_header_block(s: &mut UnixStream, block: &[u8]) -> std::io::Result<()> {
    let chunks: Vec<&[u8]> = block.chunks(16_384).collect();
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let flags = if i + 1 == chunks.len() {
            END_HEADERS
        } else {
            0
        };
        out.extend(frame(kind, flags, 1, chunk));
    }
    s.write_all(&out)
}

/// The kubelet's `:authority` (`localhost`, kubernetes#112597, 1.26 and later) is served; a
/// socket path (older kubelets, grpc-java) or its %-encoding (grpc-core 1.57+) is not a valid
/// authority and the stream is reset, as any tonic server does: docs/sharing.md says who sends
/// what.
#[test]
fn the_kubelets_authority_is_served_and_a_socket_path_is_refused_per_stream() {
    let plugin = start();
    // DevicePluginOptions{get_preferred_allocation_available: true}, gRPC-framed.
    assert_eq!(
        options_with_authority(&plugin.socket, "localhost"),
        Outcome::Answer(vec![0, 0, 0, 0, 2, 0x10, 1])
    );
    let path = plugin.socket.display().to_string();
    for authority in [path.clone(), path.replace('/', "%2F")] {
        assert_eq!(
            options_with_authority(&plugin.socket, &authority),
            Outcome::Reset(PROTOCOL_ERROR),
            "authority '{authority}'"
        );
    }
    assert_eq!(plugin.agent.get("/livez").status, 200);
    plugin.assert_serves_a_fresh_client();
}

/// A 60 KB header table entry referenced 16,000 times (about 80 KB sent, about 1 GB once
/// decoded): refused, and the agent's memory does not grow with it.
#[test]
fn an_hpack_bomb_is_refused_without_the_memory_it_asks_for() {
    let plugin = start();
    plugin.survives("HPACK bomb", |socket| {
        let mut block = Vec::new();
        // A dynamic table size update to 64 KiB (RFC 7541 §6.3), over the 4 KiB advertised.
        hpack_int(0x20, 5, 65_536, &mut block);
        block.extend(request_headers("localhost"));
        // A literal with incremental indexing, new name (§6.2.1): it enters the table as
        // index 62, the first dynamic entry.
        block.push(0x40);
        hpack_int(0, 7, 6, &mut block);
        block.extend_from_slice(b"x-bomb");
        hpack_int(0, 7, 60_000, &mut block);
        block.extend(std::iter::repeat_n(b'a', 60_000));
        // Indexed header field 62, 16,000 times (§6.1).
        block.extend(std::iter::repeat_n(0x80 | 62, 16_000));
        let mut s = connect(socket);
        let written = write_header_block(&mut s, &block);
        let end = outcome(&mut s);
        assert!(
            matches!(
                end,
                Outcome::GoAway(_) | Outcome::Reset(_) | Outcome::Closed
            ),
            "the bomb was answered: {end:?} (write: {written:?})"
        );
    });
}

/// A header block that never ends: CONTINUATION frames without END_HEADERS, up to 256 MB
/// (the loop stops when the server closes the connection).
#[test]
fn a_continuation_flood_is_cut_off_without_buffering_it() {
    let plugin = start();
    plugin.survives("CONTINUATION flood", |socket| {
        let mut s = connect(socket);
        let mut first = request_headers("localhost");
        // A literal whose value claims 300 MB: the rest of the flood is its bytes.
        literal("x-flood", b"", &mut first);
        first.truncate(first.len() - 1);
        hpack_int(0, 7, 300_000_000, &mut first);
        let mut sent = first.len();
        let mut result = s.write_all(&frame(HEADERS, 0, 1, &first));
        let fill = frame(CONTINUATION, 0, 1, &[b'a'; 16_384]);
        while result.is_ok() && sent < 256 << 20 {
            result = s.write_all(&fill);
            sent += 16_384;
        }
        let end = outcome(&mut s);
        assert!(
            matches!(end, Outcome::GoAway(_) | Outcome::Closed),
            "the flood was not cut off: {end:?} after {sent} bytes ({result:?})"
        );
        assert!(
            result.is_err(),
            "all {sent} bytes of an unfinished header block were taken"
        );
    });
}

/// A frame of 16 MiB where the server advertises 16 KiB: a connection error FRAME_SIZE_ERROR
/// (RFC 9113 §4.2), before its payload is read.
#[test]
fn a_16_mib_frame_is_refused_with_frame_size_error() {
    let plugin = start();
    plugin.survives("16 MiB frame", |socket| {
        let mut s = connect(socket);
        let mut block = request_headers("localhost");
        let size = (1 << 24) - 1;
        literal("x-big", &vec![b'a'; size - block.len() - 12], &mut block);
        block.resize(size, b'a');
        let written = s.write_all(&frame(HEADERS, END_HEADERS, 1, &block));
        let end = outcome(&mut s);
        assert_eq!(end, Outcome::GoAway(FRAME_SIZE_ERROR), "write: {written:?}");
    });
}

/// CDI spec files that are no specs: each is refused by name with its reason, in the log and
/// in `/api/v1/sharing`; the good spec beside them is read and the plugin serves. Before, the
/// link to `/dev/zero` was read until the agent was killed for memory, the FIFO stopped the
/// plugin for good, and the nested file cost 19 s of CPU.
#[test]
fn cdi_specs_that_are_no_specs_are_refused_by_name_and_the_plugin_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cdi = dir.path().join("cdi");
    std::fs::create_dir(&cdi).expect("mkdir");
    std::fs::write(
        cdi.join("nvidia.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n  containerEdits: {}\n",
    )
    .expect("spec");
    std::os::unix::fs::symlink("/dev/zero", cdi.join("zero.yaml")).expect("symlink");
    nix::unistd::mkfifo(
        &cdi.join("fifo.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .expect("mkfifo");
    // 2 MiB: over the 1 MiB a spec may have.
    std::fs::write(cdi.join("huge.yaml"), vec![b'#'; 2 << 20]).expect("huge");
    std::fs::write(cdi.join("nested.yaml"), "[".repeat(200_000)).expect("nested");
    let more = format!(
        "device_list_strategy = [\"envvar\", \"cdi-cri\"]\ncdi_spec_dirs = [\"{}\"]\n",
        cdi.display()
    );
    let plugin = start_with(dir, &more);
    let sharing = wait_for("the CDI report", Duration::from_secs(20), || {
        let s = plugin.agent.get("/api/v1/sharing").json();
        (s["cdi"]["unreadable"].as_array().map(Vec::len) == Some(4)).then_some(s)
    });
    assert_eq!(
        sharing["cdi"]["spec_files"],
        serde_json::json!([cdi.join("nvidia.yaml").display().to_string()])
    );
    let unreadable = sharing["cdi"]["unreadable"].to_string();
    let log = plugin.agent.log();
    for (file, why) in [
        ("zero.yaml", "is a character device, not a regular file"),
        ("fifo.json", "is a FIFO, not a regular file"),
        (
            "huge.yaml",
            "is 2097152 bytes, over the limit of 1048576 bytes",
        ),
        (
            "nested.yaml",
            "nests '[' and '{' 200000 deep, over the limit of 64",
        ),
    ] {
        let said = format!("{}: {why}", cdi.join(file).display());
        assert!(unreadable.contains(&said), "{said} not in {unreadable}");
        assert!(log.contains(&said), "{said} not in the log:\n{log}");
    }
    assert_eq!(plugin.agent.get("/livez").status, 200);
    plugin.assert_serves_a_fresh_client();
}
