defmodule Mix.Tasks.Bench do
  @shortdoc "Benchmarks Heft against ETS, Mnesia and DETS (memory, insert, lookup)"
  @moduledoc """
  Runs the store benchmark matrix — record kind × record count × store — each
  cell in fresh OS processes, prints a Markdown table as it goes, and writes
  `results.csv`, `results.md` and SVG plots into `bench/results/`.

      mix bench                      # default matrix: 10k, 100k, 1M records (≤ 10 minutes)
      mix bench --full               # adds 10M records and lifts the time budget
      mix bench --quick              # smoke run: small map record, ETS, 1,000 records

  Options:

    * `--kinds small_map,tuple100,random_1k,json_1k` — record kinds
    * `--stores ets,ets_compressed,mnesia,dets,heft_zlib,...` — stores
    * `--counts 10000,100000` — record counts
    * `--runs N` — runs per cell for counts up to 100,000 (default 3; median)
    * `--budget SECONDS` — time for the whole run: cells that do not fit are skipped, the goals' cells (ETS, Heft's defaults) and the cheapest first (default 480; none with `--full`)
    * `--out DIR` — output directory (default `bench/results`)
    * `--only matrix,mixed,ordered` — what to run (default all; `--quick`: the matrix): the
      mixed 2-readers/1-writer measure and ordered_set lookups against ETS at 1M records
    * `--measure-runs N`, `--measure-records N`, `--mixed-seconds S` — those measures' runs per
      store (default 5, interleaved), records (1,000,000) and seconds of mixed load (2)
    * `--ab DIR` — the measures also run Heft from the build directory DIR (an A/B of two NIFs)
  """
  use Mix.Task

  @impl true
  def run(args) do
    Mix.Task.run("compile")
    # Mix 1.15 and later keep only the applications a project lists on the
    # code path; the bench's Mnesia and DETS stores need Mnesia's.
    if function_exported?(Mix, :ensure_application!, 1),
      do: apply(Mix, :ensure_application!, [:mnesia])

    args |> Heft.Bench.parse_args() |> Heft.Bench.run()
    :ok
  end
end
