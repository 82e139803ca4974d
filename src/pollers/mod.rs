//! Built-in pollers (issue 3). Only the shared pieces are here so far; the HTTP, glob and
//! sharded-file pollers are not built yet and nothing in the binary uses this module.

pub mod template;
