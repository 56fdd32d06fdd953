defmodule Heft.BenchTest do
  # The writers of `mix bench` (Markdown, CSV, goals, SVG) on made-up cells,
  # and a `--quick` smoke run end to end. Structure only, never timings.
  use ExUnit.Case, async: true

  import ExUnit.CaptureIO
  alias Heft.Bench.{Plot, Report}

  defp cell(kind, store, count, figures) do
    stats = Map.new(figures, fn {k, v} -> {k, {v, v * 0.9, v * 1.1}} end)

    %{
      kind: kind,
      store: store,
      count: count,
      status: :ok,
      runs: 3,
      stats: stats,
      overloads: 0,
      run_s: 1.0,
      wall_s: 3.5,
      accounting: "test accounting, with a comma"
    }
  end

  defp skipped(kind, store, count, why, reason),
    do: %{
      kind: kind,
      store: store,
      count: count,
      status: :skip,
      runs: 0,
      why: why,
      reason: reason
    }

  defp cells do
    [
      cell(:small_map, "ets", 10_000, bytes: 176.0, lookup_us: 0.2, insert_us: 0.3, batch_us: 0.2),
      cell(:small_map, "heft_zlib", 10_000,
        bytes: 100.0,
        lookup_us: 0.25,
        insert_us: 0.5,
        batch_us: 0.25
      ),
      cell(:small_map, "ets", 100_000,
        bytes: 176.0,
        lookup_us: 0.4,
        insert_us: 0.5,
        batch_us: 0.3
      ),
      cell(:small_map, "heft_zlib", 100_000,
        bytes: 110.0,
        lookup_us: 0.8,
        insert_us: 0.6,
        batch_us: 0.4
      ),
      cell(:tuple100, "ets", 10_000,
        bytes: 16_873.0,
        lookup_us: 6.0,
        insert_us: 11.0,
        batch_us: 10.0
      ),
      cell(:tuple100, "heft_zlib", 10_000,
        bytes: 150.0,
        lookup_us: 4.0,
        insert_us: 9.0,
        batch_us: 5.0
      ),
      skipped(:tuple100, "ets", 1_000_000, :memory, "predicted 16.9 GB > 60% of RAM"),
      skipped(:small_map, "heft_none", 10_000, :api, "Heft API not present yet (no Heft.new/2)"),
      skipped(:json_1k, "heft_zlib", 10_000, :api, "Heft API not present yet (no Heft.new/2)")
    ]
  end

  defp columns(line), do: line |> String.split("|") |> length()

  test "Markdown rows have as many columns as the header, skips say why" do
    header = Report.header() |> String.split("\n") |> hd()

    for c <- cells() do
      assert columns(Report.row(c)) == columns(header)
      assert columns(Report.row(c, true)) == columns(header) + 1
    end

    assert Report.row(Enum.at(cells(), 6)) =~ "skipped: predicted 16.9 GB"
    assert Report.row(hd(cells())) =~ "| 10,000 | ets | 3 | 0.300 (0.270–0.330) |"
  end

  test "CSV has a header and one row per cell, with the same number of fields" do
    [header | rows] = cells() |> Report.csv() |> String.split("\n", trim: true)

    assert String.starts_with?(
             header,
             "kind,store,records,status,runs,insert_us,insert_us_min,insert_us_max,"
           )

    assert length(rows) == length(cells())
    # The quoted note holds a comma; drop it before counting fields.
    fields = fn line ->
      line |> String.replace(~r/"[^"]*"/, "x") |> String.split(",") |> length()
    end

    assert Enum.all?(rows, &(fields.(&1) == fields.(header)))
    assert Enum.any?(rows, &String.starts_with?(&1, "tuple100,ets,1000000,skip,0,"))
  end

  test "goals are ratios against ETS from the cells: met, missed, or not measured with the reason" do
    goals = Report.goals(cells())

    find = fn text, store ->
      Enum.find(goals, &(String.starts_with?(&1.goal, text) and &1.store == store))
    end

    tuple = find.("100-tuple record: bytes", "heft_zlib")
    assert tuple.status == :met
    assert_in_delta tuple.worst.ratio, 150 / 16_873, 1.0e-9

    map_bytes = find.("small map record: bytes", "heft_zlib")
    assert map_bytes.status == :met
    assert map_bytes.worst.count == 100_000

    lookup = find.("small map record: lookup", "heft_zlib")
    assert lookup.status == :missed
    assert_in_delta lookup.worst.ratio, 2.0, 1.0e-9

    assert goals |> Enum.filter(&(&1.against == {"ets", :lookup_us})) |> Enum.map(& &1.store) ==
             ["heft_zlib", "heft_zlib"]

    json = Report.goals(Enum.filter(cells(), &(&1.kind in [:json_1k, :tuple100])))
    batch = Enum.find(json, &String.starts_with?(&1.goal, "batch insert"))
    # tuple100 measured; json_1k's Heft cell skipped: judged on what ran
    assert batch.status == :met

    only_json = Report.goals(Enum.filter(cells(), &(&1.kind == :json_1k)))
    assert Enum.all?(only_json, &(&1.status == :unmeasured))
    assert Enum.find(only_json, &(&1.goal =~ "batch")).reason =~ "Heft API not present yet"

    markdown = Report.goals_markdown(goals)
    assert markdown =~ "**MISSED**: 0.800 µs vs ETS 0.400 µs at 100,000 (small_map)"
    assert markdown =~ "| met:"
  end

  test "issue 12's goals: values at 1M, payload ratios, and ratios to the same kind's :none store" do
    at = fn kind, store, count, figures -> cell(kind, store, count, figures) end

    cells = [
      at.(:small_map, "heft_zstd_dict", 1_000_000, bytes: 31.0, lookup_us: 0.5),
      at.(:small_map, "heft_zstd_dict", 100_000, bytes: 90.0, lookup_us: 0.5),
      at.(:small_map, "heft_none", 1_000_000, bytes: 60.0, lookup_us: 0.4),
      at.(:small_map, "heft_lz4", 1_000_000, bytes: 50.0, lookup_us: 0.48),
      at.(:json_1k, "heft_zstd_dict", 10_000, bytes: 150.0, payload_ratio: 0.1),
      at.(:json_1k, "ets", 10_000, bytes: 1500.0),
      at.(:random_1k, "heft_none", 10_000, bytes: 1100.0),
      at.(:random_1k, "heft_zstd", 10_000, bytes: 1100.0),
      at.(:random_1k, "heft_lz4", 10_000, bytes: 1200.0)
    ]

    goals = Report.goals(cells)

    find = fn text, store ->
      Enum.find(goals, &(String.starts_with?(&1.goal, text) and &1.store == store))
    end

    # Only the 1M cell counts for a goal stated at 1M.
    small = find.("small map record at 1M", "heft_zstd_dict")
    assert small.status == :met and small.worst.count == 1_000_000
    assert find.("small map record at 1M", "heft_lz4").status == :missed
    assert find.("small map record at 1M", "heft_zstd").status == :unmeasured

    assert find.("JSON-like 1 KB record: stored payload", "heft_zstd_dict").status == :met
    json_bytes = find.("JSON-like 1 KB record: bytes/record vs ETS", "heft_zstd_dict")
    assert_in_delta json_bytes.worst.ratio, 0.1, 1.0e-9

    dict_lookup = find.("lookup µs/op vs `compression: :none`", "heft_zstd_dict")
    assert_in_delta dict_lookup.worst.ratio, 1.25, 1.0e-9
    assert dict_lookup.status == :met
    lz4_lookup = find.("lookup µs/op vs `compression: :none`", "heft_lz4")
    assert lz4_lookup.status == :missed

    assert find.("random 1 KB record (stored raw): bytes", "heft_zstd").status == :met
    assert find.("random 1 KB record (stored raw): bytes", "heft_lz4").status == :missed

    assert find.("random 1 KB record (stored raw): bytes", "heft_zstd_dict").reason =~
             "no heft_zstd_dict and heft_none cells"

    markdown = Report.goals_markdown(goals)
    assert markdown =~ "0.500 µs vs heft_none 0.400 µs at 1,000,000 (small_map)"
    assert markdown =~ "met: 31.0 B at 1,000,000 (small_map)"
    assert "heft_none" in Report.goal_stores() and "heft_lz4" in Report.goal_stores()
  end

  @tag timeout: 120_000
  test "a heft_zstd_dict cell measures its table with the dictionary in use" do
    dir = Path.join(System.tmp_dir!(), "heft-bench-dict-#{System.unique_integer([:positive])}")

    cell = fn count ->
      spec = %{store: "heft_zstd_dict", kind: :json_1k, count: count, dir: dir}
      capture_io(fn -> send(self(), {:result, Heft.Bench.Cell.run(spec)}) end)
      assert_received {:result, result}
      result
    end

    # Past 4,096 records the table trains on its own; the records written
    # before its dictionary were re-compressed before anything was measured.
    auto = cell.(5_000)
    assert auto.status == :ok
    assert auto.note =~ "trained by the table at 4,096 records; 100.0% of the records with it"
    assert auto.payload_ratio < 0.3

    # Below, the cell trains it with Heft.train_dictionary/2.
    small = cell.(1_500)
    assert small.note =~ "trained by Heft.train_dictionary/2"
    assert small.note =~ "100.0% of the records with it"
  end

  test "Heft against ETS: one row per measured Heft cell with an ETS cell of the same kind and count" do
    markdown = Report.ratios_markdown(cells())
    assert markdown =~ "| small_map | 100,000 | heft_zlib | 0.625 | 1.20 | 1.33 | 2.00 |"
    assert length(Regex.scan(~r/^\| (small_map|tuple100) \|/m, markdown)) == 3
  end

  test "the SVG plot is well-formed XML with log ticks, axis titles, legend and markers" do
    [{"bytes", bytes} | _] = plots = Report.plots(cells(), :small_map)
    assert length(plots) == 3
    svg = Plot.svg(Map.put(bytes, :subtitle, "a machine & its <OS>"))

    {doc, _} = svg |> :binary.bin_to_list() |> :xmerl_scan.string(quiet: true)
    assert elem(doc, 0) == :xmlElement

    texts =
      Regex.scan(~r/<text[^>]*>([^<]*)<\/text>/, svg, capture: :all_but_first) |> List.flatten()

    assert "Bytes per record — small map record" in texts
    assert "a machine &amp; its &lt;OS&gt;" in texts
    assert "records in the table" in texts
    assert "bytes per record (store's accounting)" in texts
    assert Enum.all?(["10k", "100k", "ets", "heft_zlib"], &(&1 in texts))
    assert Enum.any?(texts, &(&1 =~ "not measured — heft_none" == false))
    # one line per store, a marker per point
    assert length(Regex.scan(~r/<polyline /, svg)) == 2
    assert length(Regex.scan(~r/<circle /, svg)) >= 2
  end

  test "log-scale tick labels" do
    assert Enum.map([0.01, 0.5, 2.0, 100.0, 2000.0, 10_000.0, 1.0e6], &Plot.tick/1) ==
             ["0.01", "0.5", "2", "100", "2k", "10k", "1M"]
  end

  @tag timeout: 120_000
  test "mix bench --quick runs end to end and writes the table, CSV and plots" do
    out = Path.join(System.tmp_dir!(), "heft-bench-test-#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm_rf(out) end)

    output =
      capture_io(fn -> Heft.Bench.run(Heft.Bench.parse_args(["--quick", "--out", out])) end)

    assert output =~ "| kind | records | store | runs | insert µs/op |"
    assert output =~ ~r/\| small_map \| 1,000 \| ets \| 3 \| [\d.]+ \(/
    assert output =~ "## Goals (from this run)"
    assert output =~ "Wall time:"

    [_header, row] =
      out |> Path.join("results.csv") |> File.read!() |> String.split("\n", trim: true)

    assert String.starts_with?(row, "small_map,ets,1000,ok,3,")

    for plot <- ~w(bytes insert lookup),
        do: assert(File.read!(Path.join(out, "small_map-#{plot}.svg")) =~ "<svg")

    assert File.read!(Path.join(out, "results.md")) =~ "# Heft benchmark results"
  end

  defp mixed_run(reads, p99),
    do: %{status: :ok, reads_per_s: reads, p50_us: p99 / 4, p99_us: p99, writes_per_s: 1.0e5}

  test "a measure's runs give medians per store and the Heft/ETS ratio of the runs side by side" do
    runs = %{
      "heft" => [mixed_run(900.0, 2.0), mixed_run(700.0, 3.0), mixed_run(1000.0, 2.5)],
      "ets" => [mixed_run(1000.0, 1.0), mixed_run(1000.0, 1.0), mixed_run(1000.0, 9.0)]
    }

    r = Heft.Bench.Measures.aggregate(:mixed, 1_000_000, runs)
    assert r.status == :ok and r.runs == 3
    assert r.stores["heft"].reads_per_s == {900.0, 700.0, 1000.0}
    assert r.stores["ets"].p99_us == {1.0, 1.0, 9.0}
    # 0.9, 0.7, 1.0 run by run
    assert r.ratios["heft"] == {0.9, 0.7, 1.0}
    refute Map.has_key?(r.ratios, "ets")

    goal = Heft.Bench.Measures.goal(r)
    assert goal.met and goal.how == :at_least

    slow = Map.put(runs, "heft", Enum.map(runs["heft"], &%{&1 | reads_per_s: 500.0}))
    refute Heft.Bench.Measures.goal(Heft.Bench.Measures.aggregate(:mixed, 10, slow)).met

    markdown = Heft.Bench.Measures.markdown([r])
    assert markdown =~ "| heft | 3 | 900 (700–1,000) |"
    assert markdown =~ "| 0.900 (0.700–1.00) |"
    assert markdown =~ "ratio 0.900 (median of the runs side by side), met."

    [header | rows] =
      r |> List.wrap() |> Heft.Bench.Measures.csv() |> String.split("\n", trim: true)

    assert header == "measure,store,records,runs,metric,median,min,max"
    assert "mixed,heft,1000000,3,ratio_vs_ets,0.9,0.7,1.0" in rows
    assert Enum.count(rows, &String.starts_with?(&1, "mixed,ets,")) == 4

    failed = Map.put(runs, "ets", [%{status: :error, reason: "exit 1"}])
    assert Heft.Bench.Measures.aggregate(:mixed, 10, failed).status == :error
  end

  test "options: --only picks the parts, --quick is the matrix alone, unknown parts refused" do
    assert %{matrix: false, measures: [:mixed]} = Heft.Bench.parse_args(["--only", "mixed"])
    assert %{matrix: true, measures: [:mixed, :ordered]} = Heft.Bench.parse_args([])
    assert %{matrix: true, measures: []} = Heft.Bench.parse_args(["--quick"])
    assert_raise ArgumentError, ~r/unknown part/, fn -> Heft.Bench.parse_args(["--only", "x"]) end
  end

  test "the 100-tuple record shares no list between its elements" do
    {1, tuple} = Heft.Bench.Kinds.record(:tuple100, 1)
    assert tuple_size(tuple) == 100 and elem(tuple, 0) == List.duplicate(:a, 10)
    # A shared element costs its cells once in the flat size.
    assert :erts_debug.size(tuple) == :erts_debug.flat_size(tuple)
  end

  @tag timeout: 180_000
  test "mix bench --only mixed,ordered runs both measures end to end for Heft and ETS" do
    out = Path.join(System.tmp_dir!(), "heft-bench-test-#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm_rf(out) end)
    args = ~w(--only mixed,ordered --measure-records 2000 --measure-runs 1 --mixed-seconds 0.2)

    output = capture_io(fn -> Heft.Bench.run(Heft.Bench.parse_args(args ++ ["--out", out])) end)

    assert output =~ "## mixed: 2 readers"
    assert output =~ ~r/\| heft \| 1 \| [\d,.]+ \(/
    assert output =~ "## ordered: ordered_set lookups"
    csv = File.read!(Path.join(out, "measures.csv"))
    assert csv =~ ~r/^mixed,heft,2000,1,reads_per_s,/m
    assert csv =~ ~r/^ordered,ets,2000,1,lookup_us,/m
    assert File.read!(Path.join(out, "measures.md")) =~ "Goals of the other measures"
    refute File.exists?(Path.join(out, "results.md"))
  end
end
