//! The console's HTML: escaping, URL encoding and the page frame (header, navigation, assets).

use std::fmt::Write as _;

/// `s` escaped for HTML text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` percent-encoded for a URL path segment or query value.
pub fn url_enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The signed-in caller shown in the header.
pub struct WhoLine {
    pub who: String,
    pub namespace: String,
    pub scopes: String,
    /// Whether there is a session to sign out of (authentication on).
    pub signed_in: bool,
    pub csrf: String,
}

/// A page being written: its title, its body, the caller.
pub struct Page {
    title: String,
    who: Option<WhoLine>,
    pub body: String,
}

impl Page {
    pub fn new(title: &str, who: Option<WhoLine>) -> Page {
        Page { title: title.to_string(), who, body: String::new() }
    }

    pub fn render(&self) -> String {
        let mut h = String::with_capacity(self.body.len() + 1500);
        let _ = write!(
            h,
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>{} · Kairos</title><link rel=\"stylesheet\" href=\"/ui/assets/console.css\">\
             <script src=\"/ui/assets/console.js\" defer></script></head><body>\
             <a href=\"#main\" class=\"skip\" style=\"position:absolute;left:-999px\">Skip to content</a>\
             <header><span class=\"brand\">Kairos</span>",
            esc(&self.title)
        );
        if let Some(w) = &self.who {
            h.push_str(
                "<nav aria-label=\"Console\"><a href=\"/ui/\">Overview</a><a href=\"/ui/executions\">Executions</a>\
                 <a href=\"/ui/schedules\">Schedules</a><a href=\"/ui/definitions\">Definitions</a>\
                 <a href=\"/ui/failed\">Failed</a><a href=\"/ui/audit\">Audit</a><a href=\"/ui/keys\">Keys</a></nav>",
            );
            let _ = write!(
                h,
                "<span class=\"who\" id=\"who\">{} · namespace <strong>{}</strong> · scopes {}</span>",
                esc(&w.who),
                esc(&w.namespace),
                esc(&w.scopes)
            );
            if w.signed_in {
                let _ = write!(
                    h,
                    "<form method=\"post\" action=\"/ui/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                     <button class=\"secondary\" type=\"submit\">Sign out</button></form>",
                    esc(&w.csrf)
                );
            }
        }
        let _ = write!(h, "</header><main id=\"main\">{}</main></body></html>", self.body);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_shown_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(url_enc("a b/ü?&"), "a%20b%2F%C3%BC%3F%26");
    }
}
