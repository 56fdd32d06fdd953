pub fn version() -> &'static str { "0.1.0" }
