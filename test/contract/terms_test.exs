defmodule Heft.Contract.TermsTest do
  @moduledoc "Any term as a key or a value: stored and returned intact."
  use Heft.Contract.Case, async: true
  alias Heft.Contract.Gen

  contract "every kind of term round-trips as a value, exactly" do
    tab = new(m)
    terms = Gen.interesting_terms()
    m.insert(tab, for({t, i} <- Enum.with_index(terms), do: {i, t}))

    for {t, i} <- Enum.with_index(terms) do
      assert [{^i, got}] = m.lookup(tab, i)
      assert exact(got) == exact(t), "value #{inspect(t)} came back as #{inspect(got)}"
    end
  end

  contract "every kind of term works as a key: insert, lookup, member, take, delete" do
    tab = new(m)
    terms = Gen.interesting_terms()
    assert m.insert(tab, for(t <- terms, do: {t, :v})) == true
    assert m.info(tab, :size) == length(terms)

    for t <- terms do
      assert [{got, :v}] = m.lookup(tab, t), "key #{inspect(t)} not found"
      assert exact(got) == exact(t)
      assert m.member(tab, t)
      assert m.lookup_element(tab, t, 2) == :v
    end

    for t <- terms do
      assert [{_, :v}] = m.take(tab, t)
      assert m.member(tab, t) == false
    end

    assert m.tab2list(tab) == []
  end

  contract "traversal returns every key exactly" do
    tab = new(m)
    terms = Gen.interesting_terms()
    m.insert(tab, for(t <- terms, do: {t}))

    assert Enum.map(canonical_sort(traversal(m, tab)), &exact/1) ==
             Enum.map(canonical_sort(terms), &exact/1)
  end

  contract "equal keys built differently are the same key" do
    tab = new(m)
    big = :binary.copy("0123456789", 20)
    m.insert(tab, [{Gen.large_map(), :map}, {binary_part(big, 10, 100), :sub}, {"hello", :heap}])
    m.insert(tab, {%{b: 2, a: 1}, :small_map})

    assert [{_, :map}] = m.lookup(tab, Gen.large_map_reversed())
    assert [{_, :sub}] = m.lookup(tab, :binary.copy(binary_part(big, 0, 100)))
    assert [{_, :heap}] = m.lookup(tab, binary_part("say hello", 4, 5))
    assert [{_, :small_map}] = m.lookup(tab, Map.put(%{a: 1}, :b, 2))
    assert m.insert_new(tab, {Gen.large_map_reversed(), :again}) == false
  end

  contract "large maps (> 32 keys) that differ in one value are different keys" do
    tab = new(m)
    a = Gen.large_map()
    b = Map.put(a, 40, "changed")
    c = Map.put(a, 41, "41")
    m.insert(tab, [{a, :a}, {b, :b}, {c, :c}])
    assert m.info(tab, :size) == 3
    assert m.lookup_element(tab, b, 2) == :b
    assert m.lookup_element(tab, Map.delete(c, 41), 2) == :a
  end

  contract "integers and floats of equal value are distinct keys, at every size" do
    tab = new(m)
    pairs = [{0, 0.0}, {1, 1.0}, {-1, -1.0}, {2 ** 53, 2.0 ** 53}, {2 ** 70, 2.0 ** 70}]
    m.insert(tab, for({i, f} <- pairs, k <- [i, f], do: {k, k}))
    assert m.info(tab, :size) == 2 * length(pairs)

    for {i, f} <- pairs do
      assert [{ki, _}] = m.lookup(tab, i)
      assert is_integer(ki)
      assert [{kf, _}] = m.lookup(tab, f)
      assert is_float(kf)
    end
  end

  contract "bitstrings that are not binaries are keys distinct from their binary prefix" do
    tab = new(m)

    m.insert(tab, [
      {<<1::1>>, 1},
      {<<1::2>>, 2},
      {<<2::2>>, 3},
      {<<>>, 4},
      {<<128>>, 5},
      {<<128, 0::1>>, 6}
    ])

    assert m.info(tab, :size) == 6
    assert m.lookup(tab, <<1::2>>) == [{<<1::2>>, 2}]
    assert m.lookup(tab, <<128, 0::1>>) == [{<<128, 0::1>>, 6}]
    assert m.lookup(tab, <<128, 0::2>>) == []
  end

  contract "a list nested 10_000 deep, as value and as key" do
    tab = new(m)
    deep = Gen.deep_list(10_000)
    assert m.insert(tab, {:deep, deep}) == true
    assert m.lookup_element(tab, :deep, 2) == deep
    assert m.insert(tab, {deep, :as_key}) == true
    assert m.lookup(tab, deep) == [{deep, :as_key}]
    assert m.lookup(tab, Gen.deep_list(9_999)) == []
    tuple = Gen.deep_tuple(10_000)
    assert m.insert(tab, {:tuple, tuple}) == true
    assert m.lookup_element(tab, :tuple, 2) == tuple
  end

  contract "large values: a 4 MB binary, a 100_000-element tuple and list" do
    tab = new(m)
    bin = :crypto.strong_rand_bytes(4 * 1024 * 1024)
    tuple = List.to_tuple(Enum.to_list(1..100_000))
    list = Enum.map(1..100_000, &{&1, Integer.to_string(&1)})
    m.insert(tab, [{:bin, bin}, {:tuple, tuple}, {:list, list}])
    assert m.lookup_element(tab, :bin, 2) == bin
    assert m.lookup_element(tab, :tuple, 2) == tuple
    assert m.lookup_element(tab, :list, 2) == list
    assert m.lookup(tab, bin) == []
  end

  contract "a 1 MB binary key" do
    tab = new(m)
    key = :binary.copy(<<7>>, 1024 * 1024)
    m.insert(tab, {key, :big})
    assert m.lookup(tab, :binary.copy(<<7>>, 1024 * 1024)) == [{key, :big}]
    assert m.lookup(tab, :binary.copy(<<7>>, 1024 * 1024 - 1)) == []
  end

  contract "funs come back callable, pids and refs usable" do
    tab = new(m)
    me = self()
    ref = make_ref()
    captured = :binary.copy("c", 200)
    m.insert(tab, {:k, fn x -> {x, captured} end, &Enum.reverse/1, me, ref})
    [{:k, f, g, pid, r}] = m.lookup(tab, :k)
    assert f.(1) == {1, captured}
    assert g.([1, 2]) == [2, 1]
    send(pid, {:back, r})
    assert_receive {:back, ^ref}
  end

  contract "unicode atoms and the empty atom as keys and values" do
    tab = new(m)
    atoms = [:"", :ünïcödé, :日本語, :"😀", :"with space", :"Elixir.Some.Module"]
    m.insert(tab, for(a <- atoms, do: {a, a}))

    for a <- atoms do
      assert m.lookup(tab, a) == [{a, a}]
    end

    assert m.info(tab, :size) == length(atoms)
  end
end
