//! A small W3C WebDriver client for the console's browser tests: headless Chromium driven by
//! `chromedriver` (Debian's `chromium` and `chromium-driver`), over a minimal HTTP/1.1 client
//! of its own ([`request`]). Only what the tests use: sessions, navigation, elements, scripts, screenshots.
#![allow(clippy::disallowed_methods)] // a real browser, real time

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::dev::{Killed, free_port};

/// The W3C name of an element reference in replies.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The Chromium flags the tests run with (headless, nothing phoning home).
pub const CHROMIUM_ARGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,900",
];

/// A `chromedriver` process and one browser session in it (both ended on drop).
pub struct Browser {
    port: u16,
    session: String,
    _driver: Killed,
}

/// Where Debian puts the driver and the browser (`KAIROS_CHROMEDRIVER` / `KAIROS_CHROMIUM`
/// override them).
fn paths() -> (String, String) {
    let driver =
        std::env::var("KAIROS_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let chromium = std::env::var("KAIROS_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    (driver, chromium)
}

/// Whether the driver and browser are installed (the tests fail, naming them, when not).
pub fn installed() -> Result<(), String> {
    let (driver, chromium) = paths();
    for p in [&driver, &chromium] {
        if !Path::new(p).exists() {
            return Err(format!(
                "{p} is missing: install Debian's `chromium` and `chromium-driver` \
                 (apt-get install -y chromium chromium-driver; .ci/console does)"
            ));
        }
    }
    Ok(())
}

impl Browser {
    /// Starts `chromedriver` on a free port and a headless Chromium session in it.
    pub fn start() -> Browser {
        installed().unwrap_or_else(|e| panic!("{e}"));
        let (driver, chromium) = paths();
        let port = free_port();
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{driver} starts: {e}"));
        let driver = Killed(child);
        let t = Instant::now();
        loop {
            if let Ok(v) = raw(port, "GET", "/status", &Value::Null)
                && v["ready"] == json!(true)
            {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": CHROMIUM_ARGS},
        }}});
        let v = raw(port, "POST", "/session", &caps).expect("a browser session");
        let session = v["sessionId"].as_str().expect("a session id").to_string();
        Browser { port, session, _driver: driver }
    }

    fn cmd(&self, method: &str, path: &str, body: &Value) -> Result<Value, String> {
        raw(self.port, method, &format!("/session/{}{path}", self.session), body)
    }

    /// Opens `url`.
    pub fn goto(&self, url: &str) {
        self.cmd("POST", "/url", &json!({ "url": url }))
            .unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    /// The page's URL.
    pub fn url(&self) -> String {
        self.cmd("GET", "/url", &Value::Null).unwrap().as_str().unwrap_or_default().to_string()
    }

    /// The element `css` selects, if there is one now.
    pub fn try_find(&self, css: &str) -> Option<String> {
        let v =
            self.cmd("POST", "/element", &json!({"using": "css selector", "value": css})).ok()?;
        v[ELEMENT].as_str().map(str::to_string)
    }

    /// The element `css` selects, waiting up to 10 s for it.
    pub fn find(&self, css: &str) -> String {
        let t = Instant::now();
        loop {
            if let Some(e) = self.try_find(css) {
                return e;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no {css} on {}", self.url());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Types `text` into the element `css` selects (after clearing it).
    pub fn fill(&self, css: &str, text: &str) {
        let e = self.find(css);
        let _ = self.cmd("POST", &format!("/element/{e}/clear"), &json!({}));
        self.cmd("POST", &format!("/element/{e}/value"), &json!({ "text": text }))
            .unwrap_or_else(|err| panic!("typing into {css}: {err}"));
    }

    /// Clicks the element `css` selects.
    pub fn click(&self, css: &str) {
        let e = self.find(css);
        self.cmd("POST", &format!("/element/{e}/click"), &json!({}))
            .unwrap_or_else(|err| panic!("clicking {css}: {err}"));
    }

    /// The visible text of the element `css` selects.
    /// (found again if the page changed under it, as after a click that navigates).
    pub fn text(&self, css: &str) -> String {
        let t = Instant::now();
        loop {
            let e = self.find(css);
            match self.cmd("GET", &format!("/element/{e}/text"), &Value::Null) {
                Ok(v) => return v.as_str().unwrap_or_default().to_string(),
                Err(err) => assert!(t.elapsed() < Duration::from_secs(10), "text of {css}: {err}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits up to `secs` until the text of `css` satisfies `ok`; the last text seen.
    pub fn wait_text(&self, css: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
        let t = Instant::now();
        loop {
            let text = self.try_find(css).map(|_| self.text(css)).unwrap_or_default();
            if ok(&text) {
                return text;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "{css} on {} never matched; last: {text:?}",
                self.url()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page: its result.
    pub fn run(&self, script: &str, args: Value) -> Value {
        self.cmd("POST", "/execute/sync", &json!({ "script": script, "args": args }))
            .unwrap_or_else(|e| panic!("script failed: {e}"))
    }

    /// Resizes the window.
    pub fn resize(&self, width: u32, height: u32) {
        let _ = self.cmd("POST", "/window/rect", &json!({ "width": width, "height": height }));
    }

    /// Saves a PNG of the viewport to `path`.
    pub fn screenshot(&self, path: &Path) {
        let v = self.cmd("GET", "/screenshot", &Value::Null).expect("a screenshot");
        let png = base64_decode(v.as_str().unwrap_or_default());
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.cmd("DELETE", "", &Value::Null);
    }
}

/// One WebDriver command: its `value`, or the driver's error message.
fn raw(port: u16, method: &str, path: &str, body: &Value) -> Result<Value, String> {
    let bytes = if body.is_null() { Vec::new() } else { serde_json::to_vec(body).unwrap() };
    let headers: &[(&str, &str)] = &[("Content-Type", "application/json; charset=utf-8")];
    let (status, text) = request(port, method, path, headers, &bytes).map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    if status != 200 {
        return Err(format!("{status}: {}", v["value"]["message"].as_str().unwrap_or(&text)));
    }
    Ok(v["value"].clone())
}

/// One HTTP/1.1 request to 127.0.0.1:`port`, its reply read by its `Content-Length`
/// (chromedriver keeps the connection open whatever the request asks) and returned whole (an
/// HTML page too), waiting up to 2 minutes (a command that starts a browser on a busy
/// machine).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    use std::io::{BufRead, BufReader, Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut length = None;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse::<usize>().ok();
        }
    }
    let mut out = Vec::new();
    match length {
        Some(n) => {
            out.resize(n, 0);
            r.read_exact(&mut out)?;
        }
        None => {
            r.read_to_end(&mut out)?;
        }
    }
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

/// Standard base64 (the driver's screenshots).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes() {
        assert_eq!(super::base64_decode("aGVsbG8gd29ybGQ="), b"hello world");
        assert_eq!(super::base64_decode("AAEC/w=="), [0, 1, 2, 255]);
    }
}
