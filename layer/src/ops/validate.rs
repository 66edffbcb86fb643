//! Checks of the values clients name — namespaces, queues, worker ids, execution ids,
//! idempotency keys, leases, batch sizes — each in one place, with errors that name the field.
//! A leaf: every operation, and the node at its boundary, check with these.

use super::error::{Result, invalid, shown};
use crate::limits::{IDEMPOTENCY_KEY_BYTES_MAX, LEASE_MS_MAX, LEASE_MS_MIN, NAME_BYTES_MAX};

/// Checks a namespace / queue / worker id style name.
pub fn check_name(field: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= NAME_BYTES_MAX
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:/@".contains(&b));
    if !ok {
        return Err(invalid(
            field,
            format!(
                "must be 1-{NAME_BYTES_MAX} characters of letters, digits and -_.:/@, got {}",
                shown(value)
            ),
        ));
    }
    Ok(())
}

/// Checks the namespace and execution id a request names (reads as writes: an id that
/// cannot exist is refused naming the field, not looked up).
pub fn check_ref(ns: &str, id: &str) -> Result<()> {
    check_name("namespace", ns)?;
    check_name("executionId", id)
}

/// Checks an idempotency key's length.
pub fn check_idempotency_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
        return Err(invalid(
            "idempotencyKey",
            format!("must be 1-{IDEMPOTENCY_KEY_BYTES_MAX} bytes, got {} bytes", key.len()),
        ));
    }
    Ok(())
}

/// Checks an attempt lease length (`None`: the definition's).
pub fn check_lease_ms(lease_ms: Option<u64>) -> Result<()> {
    if let Some(l) = lease_ms
        && !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&l)
    {
        return Err(invalid(
            "leaseMs",
            format!("must be 0 (the definition's) or between {LEASE_MS_MIN} and {LEASE_MS_MAX}"),
        ));
    }
    Ok(())
}

/// Checks the number of items of one call against its bound.
pub fn check_batch(field: &str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(invalid(field, format!("at most {max} per call, got {len}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_leases_are_checked_naming_the_field() {
        assert!(check_name("queue", "billing.eu-1").is_ok());
        let e = check_name("queue", "a b").unwrap_err().to_string();
        assert!(e.contains("queue"), "{e}");
        assert!(check_name("queue", &"q".repeat(NAME_BYTES_MAX + 1)).is_err());
        assert!(check_lease_ms(None).is_ok());
        assert!(check_lease_ms(Some(LEASE_MS_MIN)).is_ok());
        assert!(
            check_lease_ms(Some(LEASE_MS_MIN - 1)).unwrap_err().to_string().contains("leaseMs")
        );
        assert!(check_batch("requests", 3, 2).unwrap_err().to_string().contains("at most 2"));
        assert!(check_idempotency_key("").is_err());
    }
}
