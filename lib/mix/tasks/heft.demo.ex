defmodule Mix.Tasks.Heft.Demo do
  @shortdoc "Loads the same records into ETS and Heft and compares them, in bytes"

  @moduledoc """
  Shows Heft at work next to ETS: the same records go into an ETS set and a
  Heft table, and the task prints what each costs, in bytes, by its own
  accounting and by the kernel's (the process's RSS growth), with insert
  and lookup times; then the memory report of the node holding both.

      mix heft.demo [--count N]

  Two record kinds: the 100-tuple record of the field report,
  `{i, :erlang.make_tuple(100, List.duplicate(:a, 10))}` (default 100,000:
  about 1.7 GB in ETS), and a small map record,
  `{i, %{id: i, name: "user-\#{i}", age: rem(i, 90)}}` (10 times as many).
  Times here come from one run on whatever else the machine is doing; the
  benchmark (`mix bench`) is the place for careful figures.
  """
  use Mix.Task

  @impl true
  def run(args) do
    {opts, _, _} = OptionParser.parse(args, strict: [count: :integer])
    Mix.Task.run("app.start")
    count = Keyword.get(opts, :count, 100_000)

    shared = List.duplicate(:a, 10)

    kinds = [
      {"100-tuple of 10-atom lists", count, fn i -> {i, :erlang.make_tuple(100, shared)} end},
      {"small map", count * 10, fn i -> {i, %{id: i, name: "user-#{i}", age: rem(i, 90)}} end}
    ]

    IO.puts("""
    Heft next to ETS: the same records in an ETS set and in a Heft table.
    "own bytes" is each store's own figure in bytes (ETS: info(:memory), which
    is in words, x #{:erlang.system_info(:wordsize)}; Heft: info(:memory)). "RSS growth" is how
    much the kernel saw the process grow while loading.
    """)

    tables = Enum.map(kinds, &compare/1)

    IO.puts("\nThe node now, as Heft.Report sees it:\n")
    Heft.Report.print()

    Enum.each(tables, fn {ets, heft} ->
      :ets.delete(ets)
      Heft.delete(heft)
    end)
  end

  defp compare({label, n, make}) do
    IO.puts("#{label}, #{format_int(n)} records:")
    IO.puts(row(["store", "own bytes", "bytes/rec", "RSS growth", "insert us", "lookup us"]))
    ets = :ets.new(:demo_ets, [:set, :public])

    {ets_row, _} =
      measure("ETS set", n, make, &:ets.insert(ets, &1), &:ets.lookup(ets, &1), fn ->
        :ets.info(ets, :memory) * :erlang.system_info(:wordsize)
      end)

    IO.puts(row(ets_row))
    heft = Heft.new(:demo_heft, [:public])

    {heft_row, _} =
      measure("Heft", n, make, &Heft.insert(heft, &1), &Heft.lookup(heft, &1), fn ->
        Heft.info(heft, :memory)
      end)

    IO.puts(row(heft_row))
    [_, ets_bytes | _] = ets_row
    [_, heft_bytes | _] = heft_row
    IO.puts("Heft holds them in 1/#{ratio(ets_bytes, heft_bytes)} of ETS's bytes.\n")
    {ets, heft}
  end

  defp measure(name, n, make, insert, lookup, bytes) do
    :erlang.garbage_collect()
    rss0 = rss()
    {insert_us, _} = :timer.tc(fn -> Enum.each(1..n, fn i -> insert.(make.(i)) end) end)
    growth = rss() - rss0
    keys = for _ <- 1..100_000, do: :rand.uniform(n)
    {lookup_us, _} = :timer.tc(fn -> Enum.each(keys, lookup) end)
    own = bytes.()

    {[
       name,
       format_int(own),
       Float.round(own / n, 1),
       format_int(growth),
       Float.round(insert_us / n, 2),
       Float.round(lookup_us / length(keys), 2)
     ], own}
  end

  defp ratio(a, b) when is_binary(a), do: ratio(parse_int(a), parse_int(b))
  defp ratio(a, b), do: round(a / max(b, 1))

  defp row(cells) do
    [first | rest] = Enum.map(cells, &to_string/1)
    String.pad_trailing(first, 9) <> Enum.map_join(rest, "", &String.pad_leading(&1, 14))
  end

  defp format_int(n) do
    n
    |> Integer.to_string()
    |> String.reverse()
    |> String.replace(~r/(\d{3})(?=\d)/, "\\1,")
    |> String.reverse()
  end

  defp parse_int(s), do: s |> String.replace(",", "") |> String.to_integer()

  defp rss do
    "/proc/self/status"
    |> File.read!()
    |> String.split("\n")
    |> Enum.find_value(fn
      "VmRSS:" <> rest -> rest |> String.split() |> hd() |> String.to_integer() |> Kernel.*(1024)
      _ -> nil
    end)
  end
end
