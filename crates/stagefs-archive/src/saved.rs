//! What a saved index keeps of a reader besides the tree, handed from [`crate::Reader::saved`] to the saved-index writer without showing whose tables they are.

use std::any::Any;

/// The tables a saved index keeps of a reader besides the tree (a tar's sparse maps,
/// restart points and inner tars): opaque outside this crate, where only the format whose
/// reader made them reads them (see [`crate::tar::saved_format::tables`]).
#[derive(Clone, Copy)]
pub struct SavedTables<'a>(&'a (dyn Any + Send + Sync));

impl<'a> SavedTables<'a> {
    /// The tables that `reader`, a format's own reader, keeps.
    pub(crate) fn of<T: Any + Send + Sync>(reader: &'a T) -> SavedTables<'a> {
        SavedTables(reader)
    }

    /// The reader that made them, if it is a `T`.
    pub(crate) fn reader<T: Any>(&self) -> Option<&'a T> {
        self.0.downcast_ref()
    }
}
