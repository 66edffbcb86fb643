//! Reads issued together: a transaction's point reads run concurrently (a remote store answers
//! them in one round trip's time), their results in order.

use std::future::Future;

use futures_util::future::try_join_all;

/// How many futures one group polls in place: `try_join_all` runs up to 30 without a task
/// each (one allocation for all, its output sized once).
const GROUP: usize = 30;

/// Runs `futures` concurrently and returns their outputs in order; the first error ends it.
///
/// `try_join_all` of many futures gives each a task of its own (an allocation, a waker) and
/// collects the outputs one push at a time: a 1,000-request `SubmitBatch` regrew a vector of
/// records to a megabyte, faulting in fresh pages as it went (S1: the kernel zeroing pages
/// 8.7 % of the node's samples, 1.5 % with this). Here the futures are joined in groups of
/// [`GROUP`], the groups concurrently: the same concurrency, a task per group, one vector of
/// the final size.
pub(crate) fn join_in_order<F, T, E>(
    futures: impl IntoIterator<Item = F>,
) -> impl Future<Output = Result<Vec<T>, E>>
where
    F: Future<Output = Result<T, E>>,
{
    // The groups are made here, not in the future: it holds them alone (not the iterator, so
    // it is `Send` whenever the reads are).
    let mut futures = futures.into_iter().peekable();
    let mut groups = Vec::new();
    let mut total = 0;
    while futures.peek().is_some() {
        let group: Vec<F> = futures.by_ref().take(GROUP).collect();
        total += group.len();
        groups.push(try_join_all(group));
    }
    async move {
        if groups.len() == 1 {
            return groups.pop().expect("one group").await;
        }
        let mut out = Vec::with_capacity(total);
        for part in try_join_all(groups).await? {
            out.extend(part);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn outputs_come_in_order_and_the_first_error_ends_it() {
        for n in [0, 1, 29, 30, 31, 61, 1000] {
            let futs = (0..n).map(|i| async move {
                // Some finish later than others: the order is still the inputs'.
                if i % 7 == 0 {
                    tokio::task::yield_now().await;
                }
                Ok::<usize, String>(i)
            });
            let got = join_in_order(futs).await.unwrap();
            assert_eq!(got, (0..n).collect::<Vec<_>>(), "{n} futures");
        }
        let futs = (0..100).map(|i| async move { if i == 42 { Err(i) } else { Ok(i) } });
        assert_eq!(join_in_order(futs).await, Err(42));
    }
}
