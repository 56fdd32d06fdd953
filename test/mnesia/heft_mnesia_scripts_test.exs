defmodule Heft.MnesiaScriptsTest do
  # bench/mnesia.exs and bench/mnesia_demo.exs (bin/mnesia-demo), run end
  # to end at tiny counts in a child `elixir` with this VM's code path:
  # the report's structure and the demo's verdict, never timings.
  use ExUnit.Case, async: false

  @moduletag :mnesia
  @moduletag timeout: 300_000

  defp run_script(script, args, tmp) do
    paths = Enum.flat_map(:code.get_path(), &["-pa", List.to_string(&1)])

    System.cmd("elixir", paths ++ [script | args],
      stderr_to_stdout: true,
      env: [{"HEFT_BENCH_DIR", tmp}, {"TMPDIR", tmp}]
    )
  end

  @tag :tmp_dir
  test "bench/mnesia.exs reports memory, latencies, loads and every goal for the three stores",
       %{tmp_dir: tmp} do
    out_file = Path.join(tmp, "report.md")

    {out, 0} =
      run_script(
        "bench/mnesia.exs",
        ~w(--count 600 --disc-count 300 --dets-count 200 --reps 2 --load-reps 1 --ops 20 --out) ++
          [out_file],
        Path.join(tmp, "files")
      )

    report = File.read!(out_file)
    assert out =~ report |> String.split("\n") |> Enum.at(-2)

    for store <- ~w(heft_copies disc_copies disc_only_copies),
        do: assert(report =~ ~r/^\| #{store} \| [\d,]+ \|/m)

    assert report =~ "heft_copies 600, disc_copies 300, disc_only_copies 200"

    for op <- [
          "mnesia:dirty_write",
          "transaction(write)",
          "mnesia:dirty_read",
          "transaction(read)"
        ],
        # Twice: the samples' means, then their median operations.
        do: assert(length(Regex.scan(~r/^\| #{Regex.escape(op)} \|/m, report)) == 2)

    assert report =~ "median operation of a sample"
    assert report =~ ~r/1-min load average during the samples: [\d.]+–[\d.]+/

    goals = Regex.scan(~r/^\| .+ \| [\d.]+ \| .+ \| (met|\*\*MISSED\*\*) \|$/m, report)
    assert length(goals) == 7
    refute File.exists?(Path.join(tmp, "files"))
  end

  @tag :tmp_dir
  test "bin/mnesia-demo's script ends with three equal replicas after a SIGKILL and stops its nodes",
       %{tmp_dir: tmp} do
    {_, 0} = System.cmd("epmd", ["-daemon"])
    {out, 0} = run_script("bench/mnesia_demo.exs", ~w(--count 3000), tmp)
    assert out =~ "all replicas equal: true; size 3299 (expected 3299)"
    assert out =~ "RESULT: ok"
    assert out =~ ~r/killed heftdemo_c_\d+@\S+ \(OS pid \d+\) with SIGKILL/
    [_, u] = Regex.run(~r/heftdemo_a_(\d+)@/, out)
    {ps, 0} = System.cmd("ps", ["-eo", "args"])
    refute ps =~ ~r/heftdemo_[abc]_#{u}\b/
    assert File.ls!(tmp) == []
  end
end
