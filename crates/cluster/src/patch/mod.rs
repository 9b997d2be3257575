//! The PATCH engines: JSON merge patch, JSON patch, strategic merge patch and
//! server-side apply with managed fields.

pub mod apply;
pub mod error;
pub mod fieldset;
pub mod json;
pub mod merge;
pub mod strategic;
