# Loads the benchmark harness (bench/lib/heft: Heft.Bench.Kinds, Report and
# the rest) into a script run by `mix run`: mix.exs compiles it only in the
# :bench and :test environments, and `mix run` runs in :dev. Used with
# Code.require_file/2; a no-op where the harness is compiled already.
unless Code.ensure_loaded?(Heft.Bench) do
  # Mix 1.15 and later keep only the project's applications on the code
  # path; the harness's Mnesia store calls Mnesia.
  if function_exported?(Mix, :ensure_application!, 1),
    do: apply(Mix, :ensure_application!, [:mnesia])

  # return_diagnostics: Elixir 1.15 and later (1.20 warns without it).
  {:ok, _modules, _warnings} =
    __DIR__
    |> Path.join("lib/heft/**/*.ex")
    |> Path.wildcard()
    |> Kernel.ParallelCompiler.require(return_diagnostics: true)
end
