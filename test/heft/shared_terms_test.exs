defmodule Heft.SharedTermsTest do
  # Records with and without shared subterms. A set's record body that holds
  # no back-reference says so in its first tag, and lookups then build it
  # with the lean decoder, which trusts that flag; bodies with
  # back-references, bag bodies and bodies written before the flag existed
  # go through the decoder that keeps ids (docs/term-format.md).
  use ExUnit.Case, async: true
  import Bitwise

  @moduletag :tmp_dir

  # Every record is built at run time, so that its parts are on the heap and
  # :erts_debug.size/1 counts each shared part once.
  defp shared_records do
    l = :lists.seq(1, 10)
    b = :binary.copy("shared binary")
    m = %{a: l, b: :lists.seq(1, 3)}
    t = {l, b}

    [
      {1, :erlang.make_tuple(20, l)},
      {2, b, b, [b, b]},
      {3, m, [m, m]},
      {4, [t, t, {t}]},
      {5, %{k1: t, k2: t}},
      {6, List.duplicate(l, 3)},
      {7, List.to_tuple([l | List.duplicate(b, 20)])}
    ]
  end

  defp unshared_records do
    deep = Enum.reduce(1..300, [], fn i, acc -> [i, acc] end)

    [
      {10, %{id: 10, name: "user-#{10}", age: 10}},
      {11, List.to_tuple(for j <- 1..100, do: {j, "v#{j}"})},
      {12, [1.5, -3, :atom, {}, %{}, [], [1 | 2], 1 <<< 70, self(), make_ref()]},
      {13, String.duplicate("json-like text ", 100)},
      List.to_tuple([14 | Enum.to_list(1..20)]),
      {15, deep},
      {16, Map.new(1..40, &{&1, "#{&1}"})}
    ]
  end

  defp filled(type, records) do
    tab = Heft.new(:shared_terms, [type])
    true = Heft.insert(tab, records)
    tab
  end

  for type <- [:set, :ordered_set] do
    test "#{type}: records with shared subterms come back equal and still shared" do
      tab = filled(unquote(type), shared_records())

      for rec <- shared_records() do
        # The record really shares: counted with sharing it is smaller.
        assert :erts_debug.size(rec) < :erts_debug.flat_size(rec)
        assert [got] = Heft.lookup(tab, elem(rec, 0))
        assert got == rec
        assert :erts_debug.size(got) == :erts_debug.size(rec)
      end

      assert Enum.sort(Heft.tab2list(tab)) == Enum.sort(shared_records())
      assert Enum.sort(Heft.select(tab, [{:_, [], [:"$_"]}])) == Enum.sort(shared_records())
      assert Heft.match_object(tab, {2, :_, :_, :_}) == [Enum.at(shared_records(), 1)]
    end
  end

  for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
    test "#{type}: records without shared subterms come back equal through every read" do
      recs = unshared_records()
      tab = filled(unquote(type), recs)

      for rec <- recs do
        assert Heft.lookup(tab, elem(rec, 0)) == [rec]
        # (a bag answers with the element of each object of the key)
        element = if unquote(type) in [:set, :ordered_set], do: elem(rec, 1), else: [elem(rec, 1)]
        assert Heft.lookup_element(tab, elem(rec, 0), 2) == element
      end

      assert Enum.sort(Heft.tab2list(tab)) == Enum.sort(recs)
      assert Enum.sort(Heft.select(tab, [{:_, [], [:"$_"]}])) == Enum.sort(recs)
      assert Heft.match_object(tab, {10, :_}) == [hd(recs)]
      assert Heft.take(tab, 11) == [Enum.at(recs, 1)]
    end
  end

  # Records written to a persistent table (compression: :none), as they sit
  # in its files once it is closed.
  defp stored_bytes(dir, type, records) do
    tab = Heft.new(:stored_bytes, [type, persist: dir, compression: :none])
    true = Heft.insert(tab, records)
    :ok = Heft.close(tab)
    dir |> File.ls!() |> Enum.map(&File.read!(Path.join(dir, &1))) |> IO.iodata_to_binary()
  end

  defp has?(bytes, pattern), do: :binary.match(bytes, pattern) != :nomatch

  defp flag_records do
    l = :lists.seq(1, 2)
    [{7, 8}, {9, l, l}, List.to_tuple([30 | Enum.to_list(1..16)]), {40, %{a: 1}}]
  end

  test "a set's body is flagged exactly when it holds no back-reference; a bag's never", ctx do
    for type <- [:set, :ordered_set] do
      bytes = stored_bytes(Path.join(ctx.tmp_dir, "#{type}"), type, flag_records())
      # {7, 8}: flags 0, key_len 1, stored_len 3, key 7, unshared {KEY, 8}.
      assert has?(bytes, <<0, 1, 3, 0x87, 0x32, 0x01, 0x88>>)
      # {9, l, l}: a plain small tuple, the second l a ref to the first.
      assert has?(bytes, <<0x89, 0x23, 0x01, 0x07, 0x02, 0x81, 0x82, 0x00, 0x09, 0x01>>)
      # A 17-tuple: the unshared form of the tuple tag with its arity.
      assert has?(bytes, <<0x9E, 0x0B, 0x11, 0x01, 0x81>>)
      assert has?(bytes, <<0xA8, 0x32, 0x01, 0x08, 0x01>>)
    end

    bytes = stored_bytes(Path.join(ctx.tmp_dir, "bag"), :bag, flag_records())
    assert has?(bytes, <<0, 1, 3, 0x87, 0x22, 0x01, 0x88>>)
    assert has?(bytes, <<0x9E, 0x06, 0x11, 0x01, 0x81>>)
  end

  test "records written before bodies were flagged still read back", ctx do
    dir = Path.join(ctx.tmp_dir, "old")
    stored_bytes(dir, :set, flag_records())
    # Rewrite the records as a table of the previous format holds them:
    # the plain tuple tags (0x20 + arity, 0x06) where the flag now is.
    old = [
      {<<0x87, 0x32, 0x01, 0x88>>, <<0x87, 0x22, 0x01, 0x88>>},
      {<<0x9E, 0x0B, 0x11, 0x01>>, <<0x9E, 0x06, 0x11, 0x01>>},
      {<<0xA8, 0x32, 0x01, 0x08>>, <<0xA8, 0x22, 0x01, 0x08>>}
    ]

    [wal] = dir |> File.ls!() |> Enum.filter(&String.starts_with?(&1, "wal-"))
    path = Path.join(dir, wal)
    <<header::binary-size(24), frames::binary>> = File.read!(path)
    rewritten = reframe(frames, old)
    assert rewritten != frames
    File.write!(path, header <> rewritten)

    {:ok, tab} = Heft.open(dir)
    assert Heft.info(tab, :recovered_log_records) == length(flag_records())

    for rec <- flag_records() do
      assert Heft.lookup(tab, elem(rec, 0)) == [rec]
    end

    [{9, l1, l2}] = Heft.lookup(tab, 9)
    assert :erts_debug.size({l1, l2}) < :erts_debug.flat_size({l1, l2})
    assert Enum.sort(Heft.select(tab, [{:_, [], [:"$_"]}])) == Enum.sort(flag_records())
    :ok = Heft.close(tab)
  end

  # Frames (docs/persistence-format.md): length, crc32c of the length's 4
  # bytes and the payload, payload; the preallocated tail is zeros.
  defp reframe(<<len::little-32, _::little-32, payload::binary-size(len), rest::binary>>, subs)
       when len > 0 do
    p = Enum.reduce(subs, payload, fn {from, to}, acc -> :binary.replace(acc, from, to) end)

    <<len::little-32, crc32c(<<len::little-32, p::binary>>)::little-32, p::binary>> <>
      reframe(rest, subs)
  end

  defp reframe(rest, _subs), do: rest

  defp crc32c(bin), do: bxor(crc32c(bin, 0xFFFFFFFF), 0xFFFFFFFF)
  defp crc32c(<<>>, crc), do: crc

  defp crc32c(<<b, rest::binary>>, crc) do
    crc =
      Enum.reduce(1..8, bxor(crc, b), fn _, c ->
        if (c &&& 1) == 1, do: bxor(c >>> 1, 0x82F63B78), else: c >>> 1
      end)

    crc32c(rest, crc)
  end
end
