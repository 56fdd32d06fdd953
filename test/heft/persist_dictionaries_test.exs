defmodule Heft.PersistDictionariesTest do
  # A table's zstd dictionaries and its compression are part of the table
  # (docs/persistence-format.md, docs/tab-file.md): they survive close and
  # open, dumps, and tab2file/file2tab, and damage to a dictionary is
  # refused or repaired, never read as wrong records. The same for the
  # files byte by byte: native/heft_core/tests/crash_consistency.rs.
  use ExUnit.Case, async: true

  @moduletag :tmp_dir

  defp record(i),
    do: {i, %{id: i, name: "user-#{i}", email: "user#{i}@example.com", age: rem(i, 90)}}

  defp zstd_table(dir, opts \\ []) do
    t =
      Heft.new(
        :persist_dict,
        [:public, persist: dir, compression: {:zstd, level: 5, dictionary: :auto}] ++ opts
      )

    Heft.insert(t, for(i <- 1..600, do: record(i)))
    assert {:ok, 1} = Heft.train_dictionary(t, samples: 500)
    await_recompression(t)
    Heft.insert(t, for(i <- 601..800, do: record(i)))
    t
  end

  defp await_recompression(t) do
    case Heft.info(t, :recompression).state do
      s when s in [:done, :idle] ->
        :ok

      :failed ->
        flunk("re-compression failed")

      _ ->
        Process.sleep(5)
        await_recompression(t)
    end
  end

  defp dictionary_bytes(t), do: for(d <- Heft.info(t, :dictionaries), do: {d.id, d.bytes})

  test "dictionaries and the compression survive close and open", %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    t = zstd_table(dir)
    objects = Enum.sort(Heft.tab2list(t))
    dicts = dictionary_bytes(t)
    by_codec = Heft.info(t, :records_by_codec)
    assert by_codec.zstd_dict == 800
    :ok = Heft.close(t)

    {:ok, t} = Heft.open(dir)
    assert Heft.info(t, :compression) == {:zstd, [level: 5, dictionary: :auto]}
    assert Enum.sort(Heft.tab2list(t)) == objects
    assert dictionary_bytes(t) == dicts
    # Re-compression is not logged: without a dump since, the records
    # come back as the log holds them.
    assert Heft.info(t, :records_by_codec).zstd_dict == 200
    # New writes use the dictionary, as before.
    Heft.insert(t, record(801))
    assert Heft.info(t, :records_by_codec).zstd_dict == 201
    :ok = Heft.close(t)
  end

  test "re-compressed records count toward the dump threshold, and a dump keeps them",
       %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    # 600 writes, then 600 records re-compressed: the threshold is reached
    # by the last chunk re-compressed.
    t =
      Heft.new(:persist_dict, [
        :public,
        persist: dir,
        compression: {:zstd, dictionary: :auto},
        dump_log_write_threshold: 1200
      ])

    Heft.insert(t, for(i <- 1..600, do: record(i)))
    assert {:ok, 1} = Heft.train_dictionary(t, samples: 500)
    await_recompression(t)
    await_dump(t)
    assert Heft.info(t, :records_by_codec).zstd_dict == 600
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(dir)
    assert Heft.info(t, :records_by_codec).zstd_dict == 600
    assert Enum.sort(Heft.tab2list(t)) == for(i <- 1..600, do: record(i))
    :ok = Heft.close(t)
  end

  test "a table that trained on its own does not train again when reopened", %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    t = Heft.new(:persist_dict, [:public, persist: dir, compression: {:zstd, dictionary: :auto}])
    Heft.insert(t, for(i <- 1..5000, do: record(i)))
    await_dictionary(t)
    await_recompression(t)
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(dir)
    assert [%{id: 1, current: true}] = Heft.info(t, :dictionaries)
    Heft.insert(t, record(5001))
    # A write of a table holding enough records would start the automatic
    # training (synchronously: its state leaves :idle) if it were due.
    assert Heft.info(t, :recompression).state == :idle
    assert [%{id: 1}] = Heft.info(t, :dictionaries)
    :ok = Heft.close(t)
  end

  test "a table whose records drift as it grows retrains on its own, and keeps both dictionaries",
       %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    t = Heft.new(:persist_dict, [:public, persist: dir, compression: {:zstd, dictionary: :auto}])
    Heft.insert(t, for(i <- 1..5000, do: record(i)))
    await_dictionary(t)
    await_recompression(t)
    # Records of another shape, three times as many: at four times the
    # size at which the first training was due (5,000), a second one is,
    # and its dictionary pays (the Heft moduledoc, "Compression").
    order = fn i ->
      {i,
       "<order id=\"#{i}\"><customer>customer #{rem(i, 5000)}</customer>" <>
         "<item sku=\"SKU-#{rem(i, 313)}\" qty=\"#{rem(i, 9)}\"/>" <>
         "<status>shipped by ground freight</status></order>"}
    end

    for c <- Enum.chunk_every(5001..20_000, 1000), do: Heft.insert(t, Enum.map(c, order))
    await_dictionaries(t, 2)
    await_recompression(t)

    assert [%{id: 1, current: false}, %{id: 2, current: true, records: 20_000}] =
             Heft.info(t, :dictionaries)

    objects = Enum.sort(Heft.tab2list(t))
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(dir)
    assert [%{id: 1}, %{id: 2, current: true}] = Heft.info(t, :dictionaries)
    assert Enum.sort(Heft.tab2list(t)) == objects
    assert Heft.lookup(t, 7) == [record(7)]
    assert Heft.lookup(t, 19_999) == [order.(19_999)]
    :ok = Heft.close(t)
  end

  defp await_dictionaries(t, n) do
    if length(Heft.info(t, :dictionaries)) < n do
      Process.sleep(5)
      await_dictionaries(t, n)
    end
  end

  test "compression: :auto is kept by a reopen", %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    t = Heft.new(:persist_auto, persist: dir, compression: :auto)
    Heft.insert(t, for(i <- 1..100, do: record(i)))
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(dir)
    assert {:auto, _} = Heft.info(t, :compression)
    assert Enum.sort(Heft.tab2list(t)) == for(i <- 1..100, do: record(i))
    :ok = Heft.close(t)
  end

  defp await_dictionary(t) do
    if Heft.info(t, :dictionaries) == [] do
      Process.sleep(5)
      await_dictionary(t)
    end
  end

  defp await_dump(t) do
    if Heft.info(t, :dumps) == 0 or Heft.info(t, :dumping) do
      Process.sleep(5)
      await_dump(t)
    end
  end

  test "lz4 and zstd without a dictionary are kept by a reopen", %{tmp_dir: tmp} do
    for {c, info} <- [
          {:lz4, :lz4},
          {:zstd, {:zstd, [level: 3, dictionary: :none]}},
          {:none, :none}
        ] do
      dir = Path.join(tmp, "#{inspect(c)}")
      t = Heft.new(:persist_codec, persist: dir, compression: c)
      Heft.insert(t, for(i <- 1..50, do: record(i)))
      :ok = Heft.close(t)
      {:ok, t} = Heft.open(dir)
      assert Heft.info(t, :compression) == info
      assert length(Heft.tab2list(t)) == 50
      :ok = Heft.close(t)
    end
  end

  test "dictionaries survive a dump and the log after it", %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    t = zstd_table(dir)
    :ok = Heft.dump(t)
    # A second dictionary after the dump, only in the log.
    assert {:ok, 2} = Heft.train_dictionary(t, samples: 500)
    await_recompression(t)
    Heft.insert(t, for(i <- 801..900, do: record(i)))
    objects = Enum.sort(Heft.tab2list(t))
    dicts = dictionary_bytes(t)
    assert length(dicts) == 2
    :ok = Heft.close(t)

    {:ok, t} = Heft.open(dir)
    assert Heft.info(t, :recovered_snapshot_records) == 800
    assert Enum.sort(Heft.tab2list(t)) == objects
    assert dictionary_bytes(t) == dicts
    :ok = Heft.dump(t)
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(dir)
    assert dictionary_bytes(t) == dicts
    assert Enum.sort(Heft.tab2list(t)) == objects
    :ok = Heft.close(t)
  end

  # The offset of the snapshot's first frame holding a dictionary op
  # (tag 7): after the 24-byte header and the 25-byte start frame.
  defp first_frame_after_start, do: 24 + 25

  test "a damaged dictionary in the snapshot is refused, and repaired with counts",
       %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    t = zstd_table(dir)
    :ok = Heft.dump(t)
    # After the snapshot: 10 records compressed with its dictionary, 10
    # too short to compress.
    Heft.insert(t, for(i <- 1001..1010, do: record(i)))
    Heft.insert(t, for(i <- 2001..2010, do: {i}))
    :ok = Heft.close(t)

    path = Path.join(dir, "snapshot")
    bytes = File.read!(path)
    at = first_frame_after_start()
    {_, <<len::little-32, _crc::32, 7, _::binary>>} = :erlang.split_binary(bytes, at)
    # Flip a bit in the dictionary's bytes, near the end of its frame.
    flip = at + 8 + len - 5
    {pre, <<b, post::binary>>} = :erlang.split_binary(bytes, flip)
    File.write!(path, [pre, Bitwise.bxor(b, 1), post])

    assert Heft.open(dir) == {:error, {:corrupt, "snapshot", at}}
    {:ok, t} = Heft.open(dir, repair: true)

    assert %{file: "snapshot", offset: ^at, records_dropped: 10} = Heft.info(t, :repaired)

    assert Enum.sort(Heft.tab2list(t)) == for(i <- 2001..2010, do: {i})
    :ok = Heft.close(t)
    {:ok, t} = Heft.open(dir)
    assert Heft.info(t, :size) == 10
    :ok = Heft.close(t)
  end

  test "a damaged dictionary in a log segment is refused, and repaired", %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    t = Heft.new(:persist_dict, [:public, persist: dir, compression: {:zstd, dictionary: :auto}])
    Heft.insert(t, for(i <- 1..600, do: record(i)))
    assert {:ok, 1} = Heft.train_dictionary(t, samples: 500, recompress: false)
    Heft.insert(t, for(i <- 601..700, do: record(i)))
    :ok = Heft.close(t)

    [seg] = dir |> File.ls!() |> Enum.filter(&String.starts_with?(&1, "wal-"))
    path = Path.join(dir, seg)
    bytes = File.read!(path)
    # The frame holding the dictionary: the second batch's.
    {at, len} = frame_with_tag(bytes, 7)
    flip = at + 8 + len - 200
    {pre, <<b, post::binary>>} = :erlang.split_binary(bytes, flip)
    File.write!(path, [pre, Bitwise.bxor(b, 0x10), post])

    assert Heft.open(dir) == {:error, {:corrupt, seg, at}}
    {:ok, t} = Heft.open(dir, repair: true)
    assert %{file: ^seg, offset: ^at} = Heft.info(t, :repaired)
    # What came before the dictionary's frame, read back right.
    assert Enum.sort(Heft.tab2list(t)) == for(i <- 1..600, do: record(i))
    assert Heft.info(t, :dictionaries) == []
    :ok = Heft.close(t)
  end

  # {offset, payload length} of the first log frame whose first op has
  # tag `tag`, after the header and the start frame.
  defp frame_with_tag(bytes, tag, at \\ 24 + 25) do
    {_, <<len::little-32, _crc::32, first, _::binary>>} = :erlang.split_binary(bytes, at)
    if first == tag, do: {at, len}, else: frame_with_tag(bytes, tag, at + 8 + len)
  end

  describe "tab2file/file2tab" do
    test "carry the dictionaries and the compression", %{tmp_dir: tmp} do
      t = zstd_table(Path.join(tmp, "t"))
      file = Path.join(tmp, "t.heft")
      :ok = Heft.tab2file(t, file)
      assert {:ok, info} = Heft.tabfile_info(file)
      assert info[:version] == {2, 0}
      assert info[:size] == 800

      {:ok, copy} = Heft.file2tab(file)
      assert Enum.sort(Heft.tab2list(copy)) == Enum.sort(Heft.tab2list(t))
      assert Heft.info(copy, :compression) == {:zstd, [level: 5, dictionary: :auto]}
      assert dictionary_bytes(copy) == dictionary_bytes(t)
      # Its records are compressed with the dictionary from the start.
      assert Heft.info(copy, :records_by_codec).zstd_dict == 800
      Heft.delete(copy)
      :ok = Heft.close(t)
    end

    test "a table without dictionaries is still written as version 1", %{tmp_dir: tmp} do
      t = Heft.new(:tab_lz4, compression: :lz4)
      Heft.insert(t, for(i <- 1..100, do: record(i)))
      file = Path.join(tmp, "t.heft")
      :ok = Heft.tab2file(t, file)
      assert {:ok, info} = Heft.tabfile_info(file)
      assert info[:version] == {1, 0}
      {:ok, copy} = Heft.file2tab(file)
      assert Heft.info(copy, :compression) == :lz4
      assert Enum.sort(Heft.tab2list(copy)) == Enum.sort(Heft.tab2list(t))
    end

    test "a damaged or refused dictionary frame is corrupt, and leaves no table",
         %{tmp_dir: tmp} do
      t = zstd_table(Path.join(tmp, "t"))
      file = Path.join(tmp, "t.heft")
      :ok = Heft.tab2file(t, file)
      :ok = Heft.close(t)
      bytes = File.read!(file)
      # magic, version, then the meta frame; the dictionary frame next.
      <<_::binary-10, _tag, _seq::32, _count::32, meta_len::little-32, _::binary>> = bytes
      at = 10 + 21 + meta_len
      {_, <<2, 1::little-32, 0::32, len::little-32, _::binary>>} = :erlang.split_binary(bytes, at)

      {pre, <<b, post::binary>>} = :erlang.split_binary(bytes, at + 17 + 3)
      File.write!(file, [pre, Bitwise.bxor(b, 4), post])
      assert Heft.file2tab(file) == {:error, {:corrupt, at}}

      # Valid checksums over bytes zstd refuses as a dictionary.
      refused = <<0xEC30A437::little-32>> <> :binary.copy(<<0xFF>>, 64)
      head = <<2, 1::little-32, 0::32, byte_size(refused)::little-32>>

      frame = [
        head,
        <<:erlang.crc32(head)::little-32>>,
        refused,
        <<:erlang.crc32(refused)::little-32>>
      ]

      {pre, rest} = :erlang.split_binary(bytes, at)
      {_, post} = :erlang.split_binary(rest, 21 + len)
      File.write!(file, [pre, frame, post])
      # (Tables of this name are this module's, whose tests run one at a
      # time.)
      mine = fn -> Enum.count(Heft.all(), &(Heft.info(&1, :name) == :persist_dict)) end
      before = mine.()
      assert Heft.file2tab(file) == {:error, {:corrupt, at}}
      assert mine.() == before
    end
  end
end
