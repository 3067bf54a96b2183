//! CommInsight agent library.
