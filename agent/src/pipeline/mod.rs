//! (being written for issue 3)
