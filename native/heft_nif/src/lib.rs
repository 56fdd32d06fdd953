#[rustler::nif]
fn core_version() -> &'static str {
    heft_core::version()
}

rustler::init!("Elixir.Heft.Native");
