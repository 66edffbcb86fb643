//! Panics of the storage engine, contained: run engine code through [`contain`] and a panic
//! inside it (what redb does on some damaged pages) comes back as an `Err` with its message —
//! without the default hook printing a message and backtrace to stderr, so `kairos check` and
//! the node report the cause in their own words. Panics elsewhere print as usual.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// Depth of [`contain`] calls on this thread: a panic while above zero is reported by its
    /// caller, not by the hook.
    static CONTAINED: Cell<u32> = const { Cell::new(0) };
}

static HOOK: Once = Once::new();

/// Installs (once per process) a panic hook that stays quiet for contained panics and defers to
/// the hook it replaced for every other panic.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CONTAINED.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
}

/// Runs `f`; a panic inside it becomes `Err(message)`, printed by nobody.
pub(crate) fn contain<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    CONTAINED.with(|c| c.set(c.get() + 1));
    let out = catch_unwind(AssertUnwindSafe(f));
    CONTAINED.with(|c| c.set(c.get() - 1));
    out.map_err(|p| panic_message(&*p))
}

/// A panic payload's message.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contained_panic_is_an_error_with_its_message() {
        let r: Result<(), String> = contain(|| panic!("entered unreachable code"));
        assert_eq!(r.unwrap_err(), "entered unreachable code");
        assert_eq!(contain(|| 7).unwrap(), 7);
        // Nested: the inner one is contained, the outer goes on.
        let r = contain(|| contain(|| panic!("inner")).unwrap_err());
        assert_eq!(r.unwrap(), "inner");
        assert_eq!(CONTAINED.with(Cell::get), 0, "the depth is restored after a panic");
    }
}
