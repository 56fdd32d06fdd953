defmodule Heft.CompressionTest do
  # The codecs of `compression:` and what a table learns from its records
  # (native/heft_core/src/storage/table/learn.rs): dictionaries trained on demand
  # and on their own, re-compression in the background, `compression:
  # :auto`'s choice, and what info/1 says of them.
  use ExUnit.Case, async: true

  @codecs [
    :zlib,
    :none,
    :lz4,
    :zstd,
    {:zstd, level: 19},
    {:zstd, dictionary: :auto},
    :auto
  ]
  @types [:set, :ordered_set, :bag, :duplicate_bag]

  defp json(i) do
    %{
      "id" => i,
      "name" => "user-#{i}",
      "email" => "user-#{i}@example.com",
      "age" => rem(i, 90),
      "address" => %{"street" => "#{rem(i, 997)} Main Street", "city" => "Springfield"},
      "tags" => Enum.take(~w(admin staff guest beta), rem(i, 4) + 1)
    }
  end

  defp fill(t, range),
    do: Enum.each(Enum.chunk_every(range, 500), &Heft.insert(t, for(i <- &1, do: {i, json(i)})))

  # Waits for the background re-compression to end.
  defp settled(t) do
    case Heft.info(t, :recompression) do
      %{state: s} = r when s in [:done, :failed, :idle] ->
        r

      _ ->
        Process.sleep(5)
        settled(t)
    end
  end

  # Every kind of record: small, compressible, incompressible, shared.
  defp records do
    big = String.duplicate("abc", 400)
    shared = Enum.to_list(1..50)

    [
      {1, :a},
      {2, "x"},
      {3, big},
      {4, :crypto.strong_rand_bytes(2000)},
      {5, {shared, shared}},
      {6, json(6)},
      {7, 1.5, -0.0, [1 | 2]},
      {{:k, 8}, %{nested: %{list: List.duplicate(:atom, 100)}}}
    ]
  end

  test "every codec round-trips every kind of record in every table type" do
    for c <- @codecs, type <- @types do
      t = Heft.new(:rt, [type, compression: c])
      recs = records()
      Heft.insert(t, recs)
      for r <- recs, do: assert(Heft.lookup(t, elem(r, 0)) == [r], "#{inspect({c, type, r})}")
      assert Enum.sort(Heft.tab2list(t)) == Enum.sort(recs)

      if type in [:bag, :duplicate_bag] do
        Heft.insert(t, recs)
        want = if type == :bag, do: length(recs), else: 2 * length(recs)
        assert Heft.info(t, :size) == want, "#{inspect({c, type})}"
        Heft.delete_object(t, {3, String.duplicate("abc", 400)})
        assert Heft.lookup(t, 3) == []
      end

      Heft.delete(t)
    end
  end

  test "with a trained dictionary every table type round-trips every kind of record, big ones included" do
    # Up to 128 KiB a body is one dictionary block; past that, a zstd frame.
    big = for i <- 1..12_000, into: "", do: "user-#{i};"
    extra = [{:big, big}, {:bigger, big <> big}, {:small, %{id: 1, name: "user-1", age: 1}}]

    for type <- @types do
      t = Heft.new(:blk, [type, compression: {:zstd, dictionary: :auto}])
      fill(t, 1001..1600)
      assert {:ok, 1} = Heft.train_dictionary(t)
      settled(t)
      recs = records() ++ extra
      Heft.insert(t, recs)
      assert Heft.info(t, :records_by_codec).zstd_dict > 550
      for r <- recs, do: assert(Heft.lookup(t, elem(r, 0)) == [r], "#{inspect({type, r})}")
      for i <- [1001, 1300, 1600], do: assert(Heft.lookup(t, i) == [{i, json(i)}])
      assert length(Heft.tab2list(t)) == 600 + length(recs)

      if type in [:bag, :duplicate_bag] do
        Heft.insert(t, {6, json(6)})
        assert Heft.lookup(t, 6) |> length() == if(type == :bag, do: 1, else: 2)
        Heft.delete_object(t, {:big, big})
        assert Heft.lookup(t, :big) == []
      end

      Heft.delete(t)
    end
  end

  test "a small map table stores fewer bytes per record with a trained dictionary than with zstd alone" do
    small = fn i -> {i, %{id: i, name: "user-#{i}", age: rem(i, 90)}} end

    per_record = fn c ->
      t = Heft.new(:small, compression: c)
      Heft.insert(t, Enum.map(1..5000, small))
      # The dictionary table trains on its own at 4,096 records.
      assert %{state: s} = settled(t)
      assert s in [:done, :idle]
      assert Heft.info(t, :dictionaries) != [] == (c != :zstd)
      for i <- [1, 2500, 5000], do: assert(Heft.lookup(t, i) == [small.(i)])
      bytes = Heft.info(t, :payload_stored_bytes) / 5000
      Heft.delete(t)
      bytes
    end

    zstd = per_record.(:zstd)
    dict = per_record.({:zstd, dictionary: :auto})
    # About 31 B a record stored raw against ~26 B in dictionary blocks.
    assert dict < zstd * 0.9, "dictionary #{dict} B, zstd #{zstd} B a record"
  end

  test "info reports the compression in the shape new/2 takes, and :compressed for all but :none" do
    shapes = [
      {:zlib, {:zlib, 1}},
      {:none, :none},
      {:lz4, :lz4},
      {:zstd, {:zstd, [level: 3, dictionary: :none]}},
      {{:zstd, level: 7}, {:zstd, [level: 7, dictionary: :none]}},
      {{:zstd, dictionary: :auto, level: 2}, {:zstd, [level: 2, dictionary: :auto]}},
      {{:zstd, dictionary: :auto}, {:zstd, [level: 9, dictionary: :auto]}},
      {:auto, {:auto, {:zstd, [level: 3, dictionary: :none]}}}
    ]

    for {given, shape} <- shapes do
      t = Heft.new(:shape, compression: given)
      assert Heft.info(t, :compression) == shape
      assert Heft.info(t, :compressed) == (given != :none)
      assert Heft.info(t)[:compression] == shape
      Heft.delete(t)
    end
  end

  test "bad compression options raise ArgumentError naming :compression and create no table" do
    # Tables this test's process owns: other tests create tables meanwhile.
    mine = fn -> Enum.count(Heft.all(), &(Heft.info(&1, :owner) == self())) end
    before = mine.()

    for bad <- [
          :brotli,
          {:zstd, level: 0},
          {:zstd, level: 23},
          {:zstd, level: 3.0},
          {:zstd, dictionary: :yes},
          {:zstd, level: 3, level: 4},
          {:zstd, bogus: 1},
          {:zstd, :auto},
          {:zstd, [:auto]},
          {:zstd, [{:level, 3} | :tail]},
          {:lz4, []}
        ] do
      e = assert_raise ArgumentError, fn -> Heft.new(:bad, [:named_table, compression: bad]) end
      assert e.message =~ ":compression", inspect(bad)
      assert Heft.whereis(:bad) == :undefined
    end

    assert mine.() == before
  end

  @tag :tmp_dir
  test "a persistent table takes every codec and keeps it (test/heft/persist_dictionaries_test.exs)",
       %{tmp_dir: dir} do
    for c <- [:lz4, :zstd, {:zstd, dictionary: :auto}, :auto] do
      path = Path.join(dir, "p#{:erlang.phash2(c)}")
      t = Heft.new(:p, persist: path, compression: c)
      shape = Heft.info(t, :compression)
      :ok = Heft.close(t)
      {:ok, t} = Heft.open(path)
      assert Heft.info(t, :compression) == shape
      :ok = Heft.close(t)
    end
  end

  test "train_dictionary puts a dictionary in use, and re-compression moves every record to it" do
    for type <- @types do
      t = Heft.new(:train, [type, compression: {:zstd, dictionary: :auto}])
      fill(t, 1..3000)
      before = Heft.info(t, :payload_stored_bytes)
      assert Heft.info(t, :dictionaries) == []
      codecs = Heft.info(t, :records_by_codec)
      assert codecs.zstd + codecs.raw == 3000

      assert {:ok, 1} = Heft.train_dictionary(t)
      assert %{state: :done, done: 3000, total: 3000, recompressed: 3000} = settled(t)
      assert [%{id: 1, records: 3000, current: true, bytes: b}] = Heft.info(t, :dictionaries)
      assert b > 0
      assert Heft.info(t, :records_by_codec).zstd_dict == 3000
      assert Heft.info(t, :payload_stored_bytes) < before / 2
      for i <- [1, 777, 3000], do: assert(Heft.lookup(t, i) == [{i, json(i)}])
      training = Heft.info(t, :training)
      assert training.samples == 3000 and training.dictionary_bytes == b
      Heft.delete(t)
    end
  end

  test "records keep their dictionary after retraining, and new writes use the newest" do
    t = Heft.new(:retrain, compression: {:zstd, dictionary: :auto})
    fill(t, 1..1000)
    assert {:ok, 1} = Heft.train_dictionary(t, recompress: false)
    fill(t, 1001..2000)
    assert {:ok, 2} = Heft.train_dictionary(t, recompress: false, samples: 500)
    fill(t, 2001..2200)

    assert [%{id: 1, records: 1000, current: false}, %{id: 2, records: 200, current: true}] =
             Heft.info(t, :dictionaries)

    codecs = Heft.info(t, :records_by_codec)
    assert codecs.zstd + codecs.raw == 1000 and codecs.zstd_dict == 1200
    for i <- 1..2200//37, do: assert(Heft.lookup(t, i) == [{i, json(i)}])
  end

  test "a zstd dictionary table trains on its own once it holds enough records" do
    {n, _, _} = Heft.Native.learn_defaults()
    t = Heft.new(:own, compression: {:zstd, dictionary: :auto})
    fill(t, 1..(n - 1))
    Process.sleep(50)
    assert Heft.info(t, :dictionaries) == []
    fill(t, n..(n + 500))
    assert Heft.Test.Wait.until(fn -> Heft.info(t, :dictionaries) != [] end)
    assert %{state: :done} = settled(t)
    assert [%{id: 1, records: r}] = Heft.info(t, :dictionaries)
    assert r == n + 500
  end

  test "dictionaries count in :memory and :meta_bytes" do
    t = Heft.new(:mem, compression: {:zstd, dictionary: :auto})
    fill(t, 1..1000)
    assert Heft.info(t, :dictionary_bytes) == 0
    before = Heft.info(t, :meta_bytes)
    {:ok, _} = Heft.train_dictionary(t, recompress: false)
    d = Heft.info(t, :dictionary_bytes)
    [%{bytes: b}] = Heft.info(t, :dictionaries)
    # The bytes and zstd's two digests of them.
    assert d > b
    assert Heft.info(t, :meta_bytes) == before + d
    info = Heft.info(t)
    assert info[:memory] == info[:index_bytes] + info[:meta_bytes] + info[:arena_used_bytes]
  end

  test "compression: :auto stores noise raw and picks a dictionary for similar records" do
    noise = Heft.new(:noise, compression: :auto)
    Heft.insert(noise, for(i <- 1..1000, do: {i, :crypto.strong_rand_bytes(300)}))
    assert {:ok, :none} = Heft.train_dictionary(noise)
    assert Heft.info(noise, :compression) == {:auto, :none}
    assert settled(noise).state == :done
    assert Heft.info(noise, :records_by_codec).raw == 1000
    trials = Heft.info(noise, :training).trials
    assert Enum.map(trials, & &1.compression) |> Enum.member?(:lz4)

    similar = Heft.new(:similar, compression: :auto)
    fill(similar, 1..2000)
    assert {:ok, 1} = Heft.train_dictionary(similar)
    assert Heft.info(similar, :compression) == {:auto, {:zstd, [level: 3, dictionary: :auto]}}
    assert settled(similar).state == :done
    assert Heft.info(similar, :records_by_codec).zstd_dict == 2000
    assert length(Heft.info(similar, :training).trials) == 5
  end

  test "a refused train_dictionary changes nothing" do
    plain = Heft.new(:plain, compression: :zstd)
    fill(plain, 1..200)
    assert_raise ArgumentError, ~r/compression/, fn -> Heft.train_dictionary(plain) end
    assert Heft.info(plain, :recompression).state == :idle

    t = Heft.new(:few, compression: {:zstd, dictionary: :auto})
    fill(t, 1..10)
    assert {:error, :too_few_records} = Heft.train_dictionary(t)
    assert Heft.info(t, :dictionaries) == []
    assert Heft.info(t, :records_by_codec).zstd == 10

    for bad <- [[samples: 0], [dictionary_bytes: 2_000_000], [recompress: :yes], [bogus: 1], :x] do
      assert_raise ArgumentError, fn -> Heft.train_dictionary(t, bad) end
    end

    assert_raise ArgumentError, fn -> Heft.train_dictionary(:no_such_table) end
    assert Heft.info(t, :dictionaries) == []
  end

  test "only the owner trains a protected table" do
    t = Heft.new(:prot, compression: {:zstd, dictionary: :auto})
    fill(t, 1..200)
    task = Task.async(fn -> catch_error(Heft.train_dictionary(t)) end)
    assert %ArgumentError{} = Task.await(task)
    assert Heft.info(t, :dictionaries) == []
  end

  test "writers and readers go on while re-compression runs" do
    t = Heft.new(:busy, [:public, compression: {:zstd, dictionary: :auto}])
    # The automatic job starts at 4,096 records, then an explicit one: the
    # table is rewritten and shrinks under both walks, which swap only
    # records still as they read them.
    fill(t, 1..20_000)
    for i <- 1..20_000//3, do: Heft.insert(t, {i, {:new, i}})
    settled(t)
    {:ok, 2} = Heft.train_dictionary(t)
    for i <- 2..20_000//3, do: Heft.delete(t, i)
    settled(t)
    for i <- 1..20_000//3, do: assert(Heft.lookup(t, i) == [{i, {:new, i}}])
    for i <- 2..20_000//3, do: assert(Heft.lookup(t, i) == [])
    for i <- 3..20_000//3, do: assert(Heft.lookup(t, i) == [{i, json(i)}])
    counts = Heft.info(t, :records_by_codec)
    assert Enum.sum(Map.values(counts)) == Heft.info(t, :size)
  end
end
