//! The client against a small HTTP/1.1 server in the test (std only, on 127.0.0.1) that serves one object with ranges, an ETag and If-Match, and counts requests: whole fetches into a file, streams, and range reads with read-ahead and a small cache under concurrent readers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use stagefs_remote::{fetch_into, Client, Config, Hooks, ObjectUrl, RangeReader};

/// Serves `data` at any path; returns the port and the request counter. Stops with the test.
fn serve(data: Arc<Vec<u8>>) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(10_000) {
            let Ok(stream) = stream else { continue };
            let (data, counted) = (data.clone(), counted.clone());
            std::thread::spawn(move || answer(stream, &data, &counted));
        }
    });
    (port, count)
}

/// Answers requests on one keep-alive connection until the client closes it.
fn answer(stream: std::net::TcpStream, data: &[u8], count: &AtomicUsize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let (mut range, mut if_match) = (None, None);
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                break;
            }
            let lower = header.to_ascii_lowercase();
            if let Some(r) = lower.strip_prefix("range: bytes=") {
                let (a, b) = r.trim().split_once('-').unwrap();
                range = Some((a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()));
            }
            if let Some(m) = lower.strip_prefix("if-match: ") {
                if_match = Some(m.trim().to_string());
            }
        }
        count.fetch_add(1, Ordering::SeqCst);
        if if_match.is_some_and(|m| m != "\"v1\"") {
            let _ = out.write_all(b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n");
            continue;
        }
        let (a, b) = range.unwrap_or((0, data.len() - 1));
        let b = b.min(data.len() - 1);
        let head = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {a}-{b}/{}\r\nETag: \"v1\"\r\n\r\n",
            b + 1 - a,
            data.len()
        );
        if out.write_all(head.as_bytes()).and_then(|()| out.write_all(&data[a..=b])).is_err() {
            return;
        }
    }
}

fn object_data(len: usize) -> Arc<Vec<u8>> {
    Arc::new((0..len).map(|i| (i * 31 % 251) as u8 ^ (i >> 16) as u8).collect())
}

fn client(concurrency: usize) -> Client {
    Client::new(Config { concurrency, chunk_size: 1 << 20, ..Config::default() }).unwrap()
}

#[test]
fn a_fetch_a_stream_and_range_reads_give_the_objects_bytes() {
    let data = object_data((5 << 20) + 12345);
    let (port, _) = serve(data.clone());
    let client = client(4);
    let url = ObjectUrl::parse(&format!("http://127.0.0.1:{port}/obj"), false).unwrap();
    let object = client.stat(&url).unwrap();
    assert_eq!(object.version.size, data.len() as u64);
    assert_eq!(object.version.etag.as_deref(), Some("\"v1\""));
    let file = tempfile();
    let done = AtomicUsize::new(0);
    let hooks = Hooks { progress: &|n| done.store(n as usize, Ordering::SeqCst), cancelled: &|| false };
    fetch_into(&client, &object, &file, &hooks).unwrap();
    let mut fetched = Vec::new();
    std::fs::File::open(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)))
        .unwrap()
        .read_to_end(&mut fetched)
        .unwrap();
    assert!(fetched == *data, "the fetched bytes are the object's");
    assert_eq!(done.load(Ordering::SeqCst), data.len(), "progress reached the end");
    let mut streamed = Vec::new();
    client.stream(&object).read_to_end(&mut streamed).unwrap();
    assert!(streamed == *data, "the stream is the object");
}

/// Sequential reads coalesce into growing requests; random reads by 4 threads through a
/// cache far smaller than the object all get the right bytes.
#[test]
fn range_reads_read_ahead_sequentially_and_stay_right_with_a_small_cache() {
    let data = object_data(24 << 20);
    let (port, count) = serve(data.clone());
    let client = client(4);
    let url = ObjectUrl::parse(&format!("http://127.0.0.1:{port}/obj"), false).unwrap();
    let object = client.stat(&url).unwrap();
    // 32 MiB in flight: windows up to 8 MiB for 4 requests.
    let reader = RangeReader::new(client.clone(), object.clone(), Bounded::of(32 << 20), 32 << 20);
    let before = count.load(Ordering::SeqCst);
    let mut at = 0;
    while at < data.len() {
        let got = reader.read_at(at as u64, 128 << 10).unwrap();
        assert!(got[..] == data[at..(at + (128 << 10)).min(data.len())]);
        at += got.len();
    }
    let sequential = count.load(Ordering::SeqCst) - before;
    // 192 reads of 128 KiB: far fewer requests, each larger than one 1 MiB block.
    assert!(sequential < 12, "{sequential} requests for 24 MiB read sequentially");
    // A cache of 4 MiB for 24 MiB read at random by 4 threads.
    let reader = Arc::new(RangeReader::new(client, object, Bounded::of(4 << 20), 4 << 20));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (reader, data) = (reader.clone(), data.clone());
            std::thread::spawn(move || {
                let mut x = t + 1;
                for _ in 0..200 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let offset = (x >> 20) as usize % data.len();
                    let len = ((x >> 8) as usize % (300 << 10)) + 1;
                    let got = reader.read_at(offset as u64, len).unwrap();
                    let end = (offset + len).min(data.len());
                    assert!(got[..] == data[offset..end], "bytes at {offset}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// A cache of at most `bytes` of blocks (stagefs hands a reader its part of the open's).
struct Bounded(quick_cache::sync::Cache<u64, Arc<[u8]>, ByBytes>);

#[derive(Clone)]
struct ByBytes;

impl quick_cache::Weighter<u64, Arc<[u8]>> for ByBytes {
    fn weight(&self, _block: &u64, bytes: &Arc<[u8]>) -> u64 {
        bytes.len() as u64
    }
}

impl Bounded {
    fn of(bytes: u64) -> Box<Bounded> {
        Box::new(Bounded(quick_cache::sync::Cache::with_weighter((bytes >> 20) as usize, bytes, ByBytes)))
    }
}

impl stagefs_remote::BlockCache for Bounded {
    fn get(&self, block: u64) -> Option<Arc<[u8]>> {
        self.0.get(&block)
    }

    fn insert(&self, block: u64, bytes: Arc<[u8]>) {
        self.0.insert(block, bytes);
    }
}

/// A nameless file for the fetch (O_TMPFILE in the system's temp directory).
fn tempfile() -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(std::env::temp_dir()).unwrap()
}

/// A cache the caller shares: the reader keeps its blocks there
/// and reads them back without a request, and its read-ahead fits the bytes in flight it
/// was given (4 MiB for 4 requests: windows of one 1 MiB block).
#[test]
fn a_shared_cache_holds_the_blocks_and_requests_fit_in_flight() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<HashMap<u64, Arc<[u8]>>>>);
    impl stagefs_remote::BlockCache for Shared {
        fn get(&self, block: u64) -> Option<Arc<[u8]>> {
            self.0.lock().unwrap().get(&block).cloned()
        }
        fn insert(&self, block: u64, bytes: Arc<[u8]>) {
            self.0.lock().unwrap().insert(block, bytes);
        }
    }
    let data = object_data(8 << 20);
    let (port, count) = serve(data.clone());
    let client = client(4);
    let url = ObjectUrl::parse(&format!("http://127.0.0.1:{port}/obj"), false).unwrap();
    let object = client.stat(&url).unwrap();
    let shared = Shared::default();
    let reader = RangeReader::new(client, object, Box::new(shared.clone()), 4 << 20);
    let before = count.load(Ordering::SeqCst);
    for at in (0..data.len()).step_by(128 << 10) {
        let got = reader.read_at(at as u64, 128 << 10).unwrap();
        assert!(got[..] == data[at..at + (128 << 10)], "the bytes at {at}, read through a shared cache");
    }
    assert_eq!(count.load(Ordering::SeqCst) - before, 8, "8 MiB read ahead in 1 MiB windows: one request a block");
    let held: Vec<usize> = (0..8).map(|b| shared.0.lock().unwrap().get(&b).map_or(0, |bytes| bytes.len())).collect();
    assert_eq!(held, vec![1 << 20; 8], "every block is in the shared cache");
    let again = reader.read_at(3 << 20, 2 << 20).unwrap();
    assert!(again[..] == data[3 << 20..5 << 20]);
    assert_eq!(count.load(Ordering::SeqCst) - before, 8, "blocks the shared cache holds take no request");
}
