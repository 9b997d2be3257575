//! A small, bounded memo keyed by text, for values that are costly to compute from a
//! string the controllers see over and over (kernel-mapping regexes, worker configs).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Values computed from text, remembered by that text. Past `max` entries it starts
/// again, which is enough for the handful of distinct texts a fleet carries.
#[derive(Debug)]
pub struct Memo<V> {
    values: Mutex<Option<HashMap<String, V>>>,
    max: usize,
}

impl<V: Clone> Memo<V> {
    /// An empty memo of at most `max` values (`const`, so it can be a `static`).
    pub const fn new(max: usize) -> Self {
        Memo {
            values: Mutex::new(None),
            max,
        }
    }

    /// The value remembered for `text`, or `compute`'s, remembered when it is `Ok`.
    /// `compute` runs without the lock held.
    pub fn get_or_try<E>(
        &self,
        text: &str,
        compute: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        if let Some(value) = self.lock().as_ref().and_then(|values| values.get(text)) {
            return Ok(value.clone());
        }
        let value = compute()?;
        let mut values = self.lock();
        let values = values.get_or_insert_with(HashMap::new);
        if values.len() >= self.max {
            values.clear();
        }
        values.insert(text.to_string(), value.clone());
        Ok(value)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, V>>> {
        // Every insert completes before the guard drops, so a poisoned lock is consistent.
        self.values.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_computed_once_and_failures_are_not_remembered() {
        let memo: Memo<usize> = Memo::new(8);
        let mut calls = 0;
        for _ in 0..3 {
            let value = memo.get_or_try("abc", || {
                calls += 1;
                Ok::<_, ()>(3)
            });
            assert_eq!(value, Ok(3));
        }
        assert_eq!(calls, 1);
        assert_eq!(
            memo.get_or_try("bad", || Err::<usize, _>("first")),
            Err("first")
        );
        assert_eq!(
            memo.get_or_try("bad", || Err::<usize, _>("second")),
            Err("second")
        );
    }

    #[test]
    fn past_its_bound_it_starts_again() {
        let memo: Memo<usize> = Memo::new(2);
        for text in ["a", "b", "c"] {
            memo.get_or_try(text, || Ok::<_, ()>(text.len())).unwrap();
        }
        let mut recomputed = false;
        memo.get_or_try("a", || {
            recomputed = true;
            Ok::<_, ()>(1)
        })
        .unwrap();
        assert!(recomputed, "a was dropped when the memo filled up");
    }
}
