//! DP-SGD for tch models with dpledger accounting (skeleton; see issue 7).
