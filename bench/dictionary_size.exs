# Picks the automatic training's sample count N and dictionary size D
# (native/heft_core/src/storage/table/learn.rs AUTO_RECORDS, dict_size/2): for each
# record kind, a {:zstd, dictionary: :auto} table of 20,000 records trains
# a dictionary on N samples of D bytes (Heft.train_dictionary/2), then
# 5,000 new records are inserted and their stored bytes per record (header,
# key and body) measured, beside the other codecs' on the same records.
#   mix run bench/dictionary_size.exs [kind ...]
alias Heft.Bench.Kinds

Code.require_file("dictionary_support.exs", __DIR__)
json300 = &BenchDictionary.json_map/1

record = fn
  :json_300, i -> {i, json300.(i)}
  kind, i -> Kinds.record(kind, i)
end

kinds =
  case System.argv() do
    [] -> [:small_map, :json_300, :json_1k, :tuple100]
    names -> Enum.map(names, &String.to_atom/1)
  end

fill = fn t, kind, range -> BenchDictionary.fill(t, range, &record.(kind, &1)) end

wait = &BenchDictionary.settle/1

per_record = fn t, kind ->
  before = Heft.info(t, :payload_stored_bytes)
  fill.(t, kind, 20_001..25_000)
  (Heft.info(t, :payload_stored_bytes) - before) / 5000
end

IO.puts("kind,compression,samples,dict_bytes,train_ms,bytes_per_record")

for kind <- kinds do
  for c <- [:none, :zlib, :lz4, :zstd] do
    t = Heft.new(:m, compression: c)
    fill.(t, kind, 1..20_000)
    IO.puts("#{kind},#{inspect(c)},,,,#{Float.round(per_record.(t, kind), 1)}")
    Heft.delete(t)
  end

  for n <- [256, 1024, 4096, 16384], d <- [1024, 4096, 16384, 65536] do
    t = Heft.new(:m, compression: {:zstd, dictionary: :auto})
    fill.(t, kind, 1..20_000)
    wait.(t)

    case Heft.train_dictionary(t, samples: n, dictionary_bytes: d, recompress: false) do
      {:ok, _} ->
        tr = Heft.info(t, :training)

        IO.puts(
          "#{kind},dict,#{n},#{tr.dictionary_bytes},#{Float.round(tr.microseconds / 1000, 1)},#{Float.round(per_record.(t, kind), 1)}"
        )

      other ->
        IO.puts("#{kind},dict,#{n},#{d},,#{inspect(other)}")
    end

    Heft.delete(t)
  end
end
