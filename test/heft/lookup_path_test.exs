defmodule Heft.LookupPathTest do
  @moduledoc """
  The lookup path's shortcuts (native/heft_nif: ops.rs `key_into`,
  codec.rs `quick_key_into`, resource.rs `Tab`) against the general one.

  Inserts encode a key by the full walk; lookup/2, member/2,
  lookup_element/3, take/2 and delete/2 of an integer or binary key take
  the shortcut. A key whose two encodings differed by a byte would be
  missed, so every key is looked up, and each answer compared with ETS's
  in the same tables.
  """
  use ExUnit.Case, async: true

  @small_max Bitwise.bsl(1, 59) - 1
  @i64_max Bitwise.bsl(1, 63) - 1

  defp ints do
    around = fn n -> [n - 1, n, n + 1] end

    Enum.uniq(
      [0, 1, -1, 127, 128, -128, -129, 255, 256, 16_383, 16_384] ++
        around.(Bitwise.bsl(1, 27)) ++
        around.(@small_max) ++
        around.(-@small_max - 1) ++
        around.(Bitwise.bsl(1, 32)) ++
        around.(@i64_max) ++
        around.(-@i64_max - 1) ++
        around.(Bitwise.bsl(1, 64)) ++
        [Bitwise.bsl(1, 200), -Bitwise.bsl(1, 200)]
    )
  end

  defp binaries do
    big = :binary.copy(<<1, 2, 3, 250, 0>>, 40_000)

    sizes = Enum.to_list(0..17) ++ [63, 64, 65, 127, 128, 129, 16_383, 16_384, 100_000]

    plain = for n <- sizes, do: :binary.part(big, 0, n)
    # Sub-binaries: of a refc binary, at odd offsets, and of a heap one.
    subs =
      for {at, n} <- [{1, 0}, {3, 5}, {7, 64}, {5, 65}, {1001, 1000}, {9, 100_000}],
          do: :binary.part(big, at, n)

    heap = <<"abcdefghij">>
    plain ++ subs ++ [:binary.part(heap, 2, 5), String.duplicate("é", 40)]
  end

  defp floats, do: [0.0, -0.0, 1.0, -1.0, 128.0, 1.0e300]

  # Keys that the shortcut turns down, around the ones it takes.
  defp others,
    do: [<<1::3>>, <<0, 1::1>>, :a, {1}, [1], %{1 => 2}, {<<"ab">>}, make_ref(), self()]

  defp keys, do: ints() ++ binaries() ++ floats() ++ others()

  defp tables(type) do
    h = Heft.new(:lookup_path, [type])
    e = :ets.new(:lookup_path, [type, :public])
    {h, e}
  end

  # Each probe answers as ETS does: lookup, member, lookup_element.
  defp same_answers(h, e, probes) do
    for k <- probes do
      assert Heft.lookup(h, k) == :ets.lookup(e, k), "lookup of #{inspect(k, limit: 5)}"
      assert Heft.member(h, k) == :ets.member(e, k), "member of #{inspect(k, limit: 5)}"

      ets_element =
        try do
          {:ok, :ets.lookup_element(e, k, 2)}
        rescue
          ArgumentError -> :badarg
        end

      heft_element =
        try do
          {:ok, Heft.lookup_element(h, k, 2)}
        rescue
          ArgumentError -> :badarg
        end

      assert heft_element == ets_element, "lookup_element of #{inspect(k, limit: 5)}"
    end
  end

  for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
    test "#{type}: integer, float and binary keys at every size boundary are found as ETS finds them" do
      {h, e} = tables(unquote(type))
      # Half of the keys are stored, so the rest are probes that must miss.
      ks = keys()
      {stored, _} = ks |> Enum.with_index() |> Enum.split_with(fn {_, i} -> rem(i, 2) == 0 end)
      objs = for {k, i} <- stored, do: {k, i}
      Heft.insert(h, objs)
      :ets.insert(e, objs)
      same_answers(h, e, ks)
      # Equal but not identical terms (1 and 1.0; 0.0 and -0.0) and copies
      # of the binaries (not sub-binaries any more).
      same_answers(h, e, Enum.map(ints(), &(&1 * 1.0)) ++ Enum.map(binaries(), &:binary.copy/1))
    end

    test "#{type}: take and delete of shortcut keys remove what ETS removes" do
      {h, e} = tables(unquote(type))
      ks = keys()
      objs = for {k, i} <- Enum.with_index(ks), do: {k, i}
      Heft.insert(h, objs)
      :ets.insert(e, objs)
      {taken, deleted} = Enum.split(ks, div(length(ks), 2))
      for k <- taken, do: assert(Heft.take(h, k) == :ets.take(e, k))
      for k <- deleted, do: assert(Heft.delete(h, k) == :ets.delete(e, k))
      assert Heft.tab2list(h) == []
      assert :ets.tab2list(e) == []
    end
  end

  test "a binary key beyond a normal scheduler's budget is looked up on a dirty one" do
    {h, e} = tables(:set)
    key = :binary.copy(<<7>>, 3_000_000)
    sub = :binary.part(<<0>> <> key, 1, 3_000_000)
    Heft.insert(h, {key, :v})
    :ets.insert(e, {key, :v})
    same_answers(h, e, [key, sub, :binary.part(key, 0, 2_999_999)])
  end

  test "a handle that is another resource or a reference names no table" do
    {:ok, tmp} =
      Heft.Native.tmp_create(
        "#{System.tmp_dir!()}/heft-lookup-path-#{System.unique_integer([:positive])}",
        0o600
      )

    Heft.Native.tmp_finish(tmp, false, false)
    h = Heft.new(:lookup_path, [])
    Heft.insert(h, {1, :a})

    for ref <- [tmp, make_ref(), :not_a_table_name] do
      bad = if is_atom(ref), do: ref, else: %Heft.Table{ref: ref}
      assert_raise ArgumentError, fn -> Heft.lookup(bad, 1) end
      assert_raise ArgumentError, fn -> Heft.member(bad, 1) end
    end

    # The table itself is still found through its handle after all that.
    assert Heft.lookup(h, 1) == [{1, :a}]
  end

  test "a handle still resolves after its table's owner died, to the heir or to nothing" do
    parent = self()

    owner =
      spawn(fn ->
        tab = Heft.new(:lookup_path, [:public, {:heir, parent, :gift}])
        Heft.insert(tab, {1, :a})
        send(parent, {:tab, tab})
        receive do: (:stop -> :ok)
      end)

    tab = receive do: ({:tab, t} -> t)
    ref = Process.monitor(owner)
    send(owner, :stop)
    assert_receive {:DOWN, ^ref, _, _, _}
    # The heir owns it now: found through the same handle.
    assert Heft.lookup(tab, 1) == [{1, :a}]
    assert Heft.member(tab, 1)
    Heft.delete(tab)
    assert_raise ArgumentError, fn -> Heft.lookup(tab, 1) end
    assert_raise ArgumentError, fn -> Heft.member(tab, 1) end
  end
end
