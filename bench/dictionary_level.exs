# bench/dictionary_level.exs: bytes per record of 5,000 records inserted after training,
# stored bytes per record of all, lookup ns and insert µs, per kind and zstd level
# with a dictionary (docs/term-format.md, "Records in the arena").  mix run bench/dictionary_level.exs
# bytes/record (new inserts after training) and lookup ns per kind and codec
alias Heft.Bench.Kinds
Code.require_file("dictionary_support.exs", __DIR__)
kinds = [:small_map, :json_1k, :tuple100]
n = 20_000

fill = fn t, kind, range -> BenchDictionary.fill(t, range, &Kinds.record(kind, &1)) end

wait = &BenchDictionary.settle/1

lookup_ns = fn t, keys ->
  {us, _} = :timer.tc(fn -> for _ <- 1..5, k <- keys, do: Heft.lookup(t, k) end)
  us * 1000 / (5 * length(keys))
end

configs =
  [none: :none, zstd3: :zstd] ++
    for l <- [3, 6, 9, 12, 19], do: {:"dict#{l}", {:zstd, level: l, dictionary: :auto}}

IO.puts("kind,config,bytes_per_record(new),stored_per_record(all),lookup_ns,insert_us")

for kind <- kinds, {name, c} <- configs do
  t = Heft.new(:m, compression: c)
  fill.(t, kind, 1..n)
  wait.(t)
  before = Heft.info(t, :payload_stored_bytes)
  {ins_us, _} = :timer.tc(fn -> fill.(t, kind, (n + 1)..(n + 5000)) end)
  new = (Heft.info(t, :payload_stored_bytes) - before) / 5000
  wait.(t)
  all = Heft.info(t, :payload_stored_bytes) / Heft.info(t, :size)
  keys = Enum.take_random(1..(n + 5000), 4000)
  lookup_ns.(t, keys)
  ns = Enum.map(1..5, fn _ -> lookup_ns.(t, keys) end) |> Enum.sort() |> Enum.at(2)

  IO.puts(
    "#{kind},#{name},#{Float.round(new, 1)},#{Float.round(all, 1)},#{round(ns)},#{Float.round(ins_us / 5000, 2)}"
  )

  Heft.delete(t)
end
