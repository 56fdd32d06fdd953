defmodule Heft.CodecsTest do
  # Every codec (issue 12) over the term-format corpus (the contract
  # tests' Heft.Contract.Gen.interesting_terms/0) in every table type,
  # checked against ETS doing the same; and Heft.Memory.sizing/3's codec
  # predictions against tables of the samples.
  use ExUnit.Case, async: true
  alias Heft.Contract.Gen

  @compressions [
    :none,
    :zlib,
    :lz4,
    :zstd,
    {:zstd, level: 19},
    {:zstd, dictionary: :auto}
  ]
  @types [:set, :ordered_set, :bag, :duplicate_bag]

  # The codec a compression's bodies carry, as info(t, :records_by_codec)
  # names it.
  defp codec(:none), do: :raw
  defp codec(:zlib), do: :zlib
  defp codec(:lz4), do: :lz4
  defp codec({:zstd, dictionary: :auto}), do: :zstd_dict
  defp codec(_zstd), do: :zstd

  # Each corpus term in a record long and repetitive enough to be stored
  # compressed by every codec: the term itself is then inside a
  # compressed body.
  defp records(tag) do
    for {t, i} <- Enum.with_index(Gen.interesting_terms()) do
      {i, t, tag, String.duplicate("heft record #{rem(i, 7)} ", 6), [i, t]}
    end
  end

  # Records like the corpus's, for a dictionary to learn from.
  defp filler do
    for j <- 1..600,
        do: {-j, %{name: "user-#{j}", tags: [:a, :b]}, String.duplicate("heft record ", 4)}
  end

  defp wait_recompressed(t) do
    if Heft.info(t, :recompression).state in [:sampling, :training, :running] do
      Process.sleep(10)
      wait_recompressed(t)
    else
      :ok
    end
  end

  defp same_as_ets(t, e, keys) do
    for k <- keys do
      got = Heft.lookup(t, k)
      want = :ets.lookup(e, k)

      assert Enum.map(got, &exact/1) == Enum.map(want, &exact/1),
             "#{inspect(Heft.info(t, :compression))} key #{inspect(k)}: #{inspect(got, limit: 8)}"
    end

    assert Enum.sort(Enum.map(Heft.tab2list(t), &exact/1)) ==
             Enum.sort(Enum.map(:ets.tab2list(e), &exact/1))
  end

  defp exact(term), do: :erlang.term_to_binary(term, [:deterministic])

  for compression <- @compressions, type <- @types do
    @tag compression: compression, table_type: type
    test "#{inspect(compression)} round-trips the term corpus in a #{type} table",
         %{compression: compression, table_type: type} do
      t = Heft.new(:codecs, [type, compression: compression])
      e = :ets.new(:codecs, [type])
      dictionary? = codec(compression) == :zstd_dict

      # A dictionary table: records before its dictionary (re-compressed
      # in the background), then a dictionary, then records with it.
      before = records(:before)
      Heft.insert(t, before ++ filler())
      :ets.insert(e, before ++ filler())

      if dictionary? do
        assert {:ok, _} = Heft.train_dictionary(t, samples: 600)
        wait_recompressed(t)
      end

      later = records(:after)
      Enum.each(later, &Heft.insert(t, &1))
      Enum.each(later, &:ets.insert(e, &1))

      by = Heft.info(t, :records_by_codec)
      assert by[codec(compression)] > 0, inspect(by)
      if dictionary?, do: assert(by.zstd == 0, inspect(by))

      same_as_ets(t, e, Enum.map(before, &elem(&1, 0)))
      # Take and delete_object read bodies too.
      for k <- 0..4 do
        assert Enum.map(Heft.take(t, k), &exact/1) == Enum.map(:ets.take(e, k), &exact/1)
      end

      [obj | _] = :ets.lookup(e, 5)
      Heft.delete_object(t, obj)
      :ets.delete_object(e, obj)
      same_as_ets(t, e, Enum.map(before, &elem(&1, 0)))
      Heft.delete(t)
    end
  end

  describe "Heft.Memory.sizing/3 :codecs" do
    defp map_record(i), do: {i, %{id: i, name: "user-#{i}", age: rem(i, 90)}}
    defp json_record(i), do: {i, Heft.Bench.Kinds.json(i)}

    # What a table of `records` with `compression` stores per record. A
    # dictionary table compresses records its dictionary never saw; as the
    # prediction does, each quarter of the records is stored by a table
    # whose dictionary was trained on the other three quarters (a
    # dictionary trained on other records, of another spread of ids,
    # compresses these records up to a tenth better or worse, whichever
    # way the VM orders a small map's keys).
    defp stored_per_record(records, compression) do
      if codec(compression) == :zstd_dict do
        quarters =
          records |> Enum.with_index() |> Enum.group_by(&rem(elem(&1, 1), 4), &elem(&1, 0))

        {bytes, by} =
          Enum.reduce(0..3, {0, %{}}, fn f, {bytes, by} ->
            train = Enum.flat_map(Map.delete(quarters, f), &elem(&1, 1))
            info = stored(quarters[f], compression, train)

            {bytes + info.payload_stored_bytes,
             Map.merge(by, info.records_by_codec, fn _, a, b -> a + b end)}
          end)

        {bytes / length(records), by}
      else
        info = stored(records, compression, [])
        {info.payload_stored_bytes / info.size, info.records_by_codec}
      end
    end

    defp stored(records, compression, train) do
      t = Heft.new(:sizing_check, compression: compression)

      if train != [] do
        Heft.insert(t, train)
        assert {:ok, _} = Heft.train_dictionary(t, samples: length(train), recompress: false)
        Heft.delete_all_objects(t)
      end

      Heft.insert(t, records)
      info = Map.new(Heft.info(t))
      Heft.delete(t)
      info
    end

    test "every codec's stored bytes are those of a table of the samples, within 5%" do
      for fun <- [&map_record/1, &json_record/1] do
        samples = Enum.map(1..2000, fun)
        s = Heft.Memory.sizing(samples, 1_000_000)

        assert Enum.map(s.codecs, & &1.compression) ==
                 [:none, :zlib, :lz4, :zstd, {:zstd, dictionary: :auto}]

        for c <- s.codecs do
          {real, by} = stored_per_record(samples, c.compression)

          assert_in_delta c.stored_bytes_per_record,
                          real,
                          0.05 * real,
                          "#{inspect(c.compression)}: #{inspect(by)}"

          assert c.bytes == c.arena_bytes + c.index_bytes
          assert c.dictionary_trained == (codec(c.compression) == :zstd_dict)
          assert c.decode_ns >= 0
        end
      end
    end

    test "a dictionary's memory is in the prediction, and it pays on JSON-like records" do
      samples = Enum.map(1..2000, &json_record/1)
      s = Heft.Memory.sizing(samples, 1_000_000)
      [_none, _zlib, _lz4, zstd, dict] = s.codecs
      assert dict.dictionary_bytes > 0 and dict.dictionary_memory > dict.dictionary_bytes
      assert zstd.dictionary_bytes == 0
      assert dict.stored_bytes_per_record < zstd.stored_bytes_per_record / 1.5
      assert dict.bytes < zstd.bytes
    end

    test "too few samples to train: the dictionary codec is predicted as plain zstd" do
      samples = Enum.map(1..3, &json_record/1)
      s = Heft.Memory.sizing(samples, 1000)
      [_, _, _, _zstd, dict] = s.codecs
      refute dict.dictionary_trained
      # Plain zstd at a dictionary table's level (9 unless given).
      [plain] = Heft.Native.sizing_predict(samples, 1, false, [{:zstd, 9, false}], 1000)
      assert dict.stored_bytes_per_record == plain.stored_bytes / plain.records
    end

    test "samples that are not tuples are refused with an ArgumentError" do
      assert_raise ArgumentError, fn -> Heft.Native.sizing_predict([1], 1, false, [:none], 1) end

      assert_raise ArgumentError, fn ->
        Heft.Native.sizing_predict([{1}], 2, false, [:none], 1)
      end

      assert_raise ArgumentError, fn ->
        Heft.Native.sizing_predict([{1}], 1, false, [:bogus], 1)
      end
    end
  end
end
