//! The nesting bound of a YAML definition, enforced by the YAML parser itself (issue 24): the
//! same parser serde_yaml_ng runs (libyaml, as `unsafe-libyaml`), driven event by event, stops
//! at the first collection deeper than the limit. A YAML parser's work grows faster than
//! linearly with nesting (a 240 KB `[a'b, [[[…` took ~89 s of CPU), so the whole document must
//! never be parsed before the bound is checked; parsing stops after the limit's worth of
//! collections plus the parser's look-ahead (at most 1,024 characters per simple key).
//!
//! A lexer's guess cannot do this: a quote inside a plain scalar (`a'b`) is not a quote to
//! YAML, and hid the brackets after it from the former pre-scan.

use std::mem::MaybeUninit;

/// How deeply `text` (YAML) nests collections, counted until it goes over `limit`: `Ok(())`
/// within it, `Err(depth)` at the first collection past it. A syntax error ends the count with
/// `Ok(())`: the real parse reports it with its position.
pub(crate) fn within(text: &str, limit: usize) -> Result<(), usize> {
    // Boxed: the parser keeps pointers into itself once initialized, so it must not move.
    let mut parser = Box::new(MaybeUninit::<unsafe_libyaml::yaml_parser_t>::uninit());
    let p = parser.as_mut_ptr();
    // SAFETY: `p` points to memory that stays in place (boxed) until `yaml_parser_delete`;
    // `text` outlives the parser; each event is deleted after its type is read, and nothing
    // of an event is kept. This is how serde_yaml_ng drives the same functions.
    unsafe {
        if unsafe_libyaml::yaml_parser_initialize(p).fail {
            return Ok(());
        }
        unsafe_libyaml::yaml_parser_set_encoding(p, unsafe_libyaml::YAML_UTF8_ENCODING);
        unsafe_libyaml::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as _);
        let mut depth = 0usize;
        let outcome = loop {
            let mut event = MaybeUninit::<unsafe_libyaml::yaml_event_t>::uninit();
            let e = event.as_mut_ptr();
            if unsafe_libyaml::yaml_parser_parse(p, e).fail {
                break Ok(());
            }
            let kind = (*e).type_;
            unsafe_libyaml::yaml_event_delete(e);
            match kind {
                unsafe_libyaml::YAML_SEQUENCE_START_EVENT
                | unsafe_libyaml::YAML_MAPPING_START_EVENT => {
                    depth += 1;
                    if depth > limit {
                        break Err(depth);
                    }
                }
                unsafe_libyaml::YAML_SEQUENCE_END_EVENT
                | unsafe_libyaml::YAML_MAPPING_END_EVENT => {
                    depth = depth.saturating_sub(1);
                }
                unsafe_libyaml::YAML_STREAM_END_EVENT => break Ok(()),
                _ => {}
            }
        };
        unsafe_libyaml::yaml_parser_delete(p);
        outcome
    }
}
