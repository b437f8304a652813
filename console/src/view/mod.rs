//! Building blocks of the pages: badges, tables and SVG pictures, each a
//! pure function of read-model data.

pub mod charts;
pub mod format;
pub mod lists;
pub mod phase;
pub mod slotmap;
pub mod topology;
