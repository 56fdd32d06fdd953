# Writes json_1k.bin (the JSON of eight mix bench records) for core.rs.
# Run from the repository root: elixir native/heft_core/benches/json_1k.exs
Code.require_file("bench/lib/heft/bench/kinds.ex")
keys = [1, 777, 12_345, 54_321, 99_999, 250_000, 654_321, 1_000_000]
data = for i <- keys, into: <<>>, do: Heft.Bench.Kinds.json(i)
true = byte_size(data) == 1024 * length(keys)
File.write!("native/heft_core/benches/json_1k.bin", data)
