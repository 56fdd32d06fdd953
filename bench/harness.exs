# Loads the benchmark harness (bench/lib/heft: Heft.Bench.Kinds, Report and
# the rest) into a script run by `mix run`: mix.exs compiles it only in the
# :bench and :test environments, and `mix run` runs in :dev. Used with
# Code.require_file/2; a no-op where the harness is compiled already.
unless Code.ensure_loaded?(Heft.Bench) do
  {:ok, _modules, _warnings} =
    __DIR__
    |> Path.join("lib/heft/**/*.ex")
    |> Path.wildcard()
    |> Kernel.ParallelCompiler.require()
end
