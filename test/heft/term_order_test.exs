defmodule Heft.TermOrderTest do
  # An ordered_set orders its keys in native code, on their stored bytes.
  # These tests insert a few thousand random terms of every type as keys and
  # check the table's order against the VM's own: Enum.sort/1, and a real
  # :ets ordered_set given the same inserts (which also says which of two
  # == keys survives: the one inserted last).
  use ExUnit.Case, async: true

  @seed 20_240_611

  setup_all do
    # Ports of this node: a few real ones (closed when the test ends).
    ports = for _ <- 1..4, do: Port.open({:spawn, "cat"}, [:binary])
    on_exit(fn -> Enum.each(ports, &safe_close/1) end)
    %{ports: ports ++ Port.list()}
  end

  defp safe_close(port) do
    Port.close(port)
  rescue
    ArgumentError -> :ok
  end

  test "random keys of every type come back in Erlang term order", %{ports: ports} do
    :rand.seed(:exsss, @seed)
    terms = for i <- 1..3_000, do: gen(3, ports, i)
    check_order(terms)
  end

  test "numbers: integers of any size against floats, exactly" do
    big = [2 ** 53, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 2 ** 64 + 1, 10 ** 30, 2 ** 1023]
    ints = big ++ Enum.map(big, &(-&1)) ++ [0, 1, -1, 127, 128, -128]
    floats = Enum.map(ints, &(&1 * 1.0)) ++ [0.5, -0.5, 1.0e300, -1.0e300, 9.007199254740993e15]

    check_order(Enum.shuffle(ints ++ floats ++ Enum.map(ints, &(&1 + 0.5))))
  end

  test "maps: size, then keys in map-key order (integers before floats), then values" do
    maps =
      for a <- [1, 1.0, 2, 2.0, :a],
          b <- [1, 1.0, 3, :b],
          v <- [1, 1.0, :x] do
        [%{a => v}, %{a => v, b => v}, %{{a} => b}]
      end

    big =
      for _ <- 1..200 do
        Map.new(Enum.random(33..40)..1//-1, fn k ->
          {Enum.random([k, k * 1.0]), Enum.random([0, 0.0])}
        end)
      end

    check_order(Enum.shuffle(List.flatten(maps) ++ big))
  end

  test "next/2 and prev/2 from keys that are not in the table agree with :ets", %{ports: ports} do
    :rand.seed(:exsss, @seed + 1)
    keys = for i <- 1..1_000, do: gen(2, ports, i)
    {heft, ets} = both(keys)

    for i <- 1..1_000 do
      probe = gen(2, ports, i + 1_000)
      assert Heft.next(heft, probe) === :ets.next(ets, probe), "next #{inspect(probe)}"
      assert Heft.prev(heft, probe) === :ets.prev(ets, probe), "prev #{inspect(probe)}"
      assert Heft.lookup(heft, probe) === :ets.lookup(ets, probe)
    end
  end

  # Inserts `terms` as keys (one insert each, in order) into a Heft and an
  # ETS ordered_set; the tables agree with each other and with Enum.sort/1.
  defp check_order(terms) do
    {heft, ets} = both(terms)
    got = Enum.map(Heft.tab2list(heft), &elem(&1, 0))
    assert got === Enum.map(:ets.tab2list(ets), &elem(&1, 0))
    assert got === sort_collapsing_equal(terms)
    assert Heft.tab2list(heft) === :ets.tab2list(ets), "the last of equal keys holds its value"
    assert Heft.info(heft, :size) == :ets.info(ets, :size)
    assert Heft.first(heft) === :ets.first(ets)
    assert Heft.last(heft) === :ets.last(ets)

    assert Heft.foldr(fn {k, _}, acc -> [k | acc] end, [], heft) === got

    for t <- Enum.take_random(terms, 300),
        do: assert(Heft.lookup(heft, t) === :ets.lookup(ets, t))
  end

  defp both(terms) do
    heft = Heft.new(:order, [:ordered_set])
    ets = :ets.new(:order, [:ordered_set])

    terms
    |> Enum.with_index()
    |> Enum.each(fn {t, i} ->
      Heft.insert(heft, {t, i})
      :ets.insert(ets, {t, i})
    end)

    {heft, ets}
  end

  # Enum.sort/2 with <= is stable: of a run of == terms, keep the last
  # inserted (Enum.sort/1 makes no such promise).
  defp sort_collapsing_equal(terms) do
    terms
    |> Enum.sort(&<=/2)
    |> Enum.chunk_while(
      [],
      fn
        t, [] -> {:cont, [t]}
        t, [h | _] = run when t == h -> {:cont, [t | run]}
        t, run -> {:cont, hd(run), [t]}
      end,
      fn
        [] -> {:cont, []}
        run -> {:cont, hd(run), []}
      end
    )
  end

  # A random term. Small pools make equal and == terms common.
  defp gen(0, ports, i), do: leaf(ports, i)

  defp gen(depth, ports, i) do
    case :rand.uniform(12) do
      n when n <= 7 ->
        leaf(ports, i)

      8 ->
        List.to_tuple(for _ <- 1..(:rand.uniform(4) - 1)//1, do: gen(depth - 1, ports, i))

      9 ->
        for _ <- 1..(:rand.uniform(4) - 1)//1, do: gen(depth - 1, ports, i)

      10 ->
        # An improper list.
        [gen(depth - 1, ports, i) | gen(0, ports, i)]

      11 ->
        Map.new(
          for _ <- 1..(:rand.uniform(4) - 1)//1,
              do: {gen(depth - 1, ports, i), gen(depth - 1, ports, i)}
        )

      12 ->
        fun_with(gen(depth - 1, ports, i))
    end
  end

  defp leaf(ports, i) do
    case :rand.uniform(16) do
      1 ->
        Enum.random([-2, -1, 0, 1, 2, 3, 255, 256, -129])

      2 ->
        Enum.random([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 1.0e19, 1.8446744073709552e19])

      3 ->
        Enum.random([2 ** 64, -(2 ** 64), 2 ** 63, -(2 ** 63), 2 ** 63 - 1, 10 ** 20, 2 ** 200])

      4 ->
        Enum.random([:a, :b, :ab, :é, :ä, :ā, :日本, :"", true, nil])

      5 ->
        Enum.random([make_ref(), external_ref()])

      6 ->
        Enum.random([self(), spawn(fn -> :ok end), external_pid()])

      7 ->
        Enum.random([Enum.random(ports), external_port()])

      8 ->
        Enum.random([&Enum.map/2, &Enum.at/2, &:lists.sort/1, &Kernel.+/2, fun_with(i)])

      9 ->
        Enum.random(["", "a", "ab", "b", <<0>>, <<255>>, "日"])

      10 ->
        Enum.random([<<1::1>>, <<0::1>>, <<1::3>>, <<97, 1::3>>, <<97, 0::7>>, <<255, 1::2>>])

      11 ->
        Enum.random([[], ~c"abc", [1, 2]])

      12 ->
        Enum.random([{}, %{}])

      _ ->
        Enum.random([
          :rand.uniform(1000) - 500,
          :rand.uniform() * 10 - 5,
          :rand.uniform(20) * 1.0
        ])
    end
  end

  # Local funs of this module: four kinds, each capturing a term.
  defp fun_with(x) do
    Enum.random([fn -> x end, fn y -> {x, y} end, fn -> [x] end, fn a, b -> {a, b, x} end])
  end

  @nodes [:a@host, :b@host, :zz@host]

  defp external_pid do
    atom_ext(Enum.random(@nodes))
    |> then(
      &<<131, 88, &1::binary, :rand.uniform(5)::32, :rand.uniform(3) - 1::32,
        :rand.uniform(3)::32>>
    )
    |> :erlang.binary_to_term()
  end

  defp external_port do
    node = atom_ext(Enum.random(@nodes))
    id = Enum.random([1, 7, 2 ** 40])
    creation = :rand.uniform(3)
    <<131, 120, node::binary, id::64, creation::32>> |> :erlang.binary_to_term()
  end

  # External references of 1 to 3 words, never all zero (OTP 25 crashes
  # comparing all-zero references of different lengths).
  defp external_ref do
    words = for _ <- 1..:rand.uniform(3), do: Enum.random([0, 1, 7, 0xFFFFFFFF])
    words = if Enum.all?(words, &(&1 == 0)), do: [5 | tl(words)], else: words
    node = atom_ext(Enum.random(@nodes))
    body = for w <- words, into: <<>>, do: <<w::32>>

    <<131, 90, length(words)::16, node::binary, :rand.uniform(3)::32, body::binary>>
    |> :erlang.binary_to_term()
  end

  defp atom_ext(atom) do
    name = Atom.to_string(atom)
    <<119, byte_size(name), name::binary>>
  end
end
