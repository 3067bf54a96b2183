//! test bed runner library (being written).
