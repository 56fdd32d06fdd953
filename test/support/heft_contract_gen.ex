defmodule Heft.Contract.Gen do
  @moduledoc """
  A small seeded random generator of terms, objects and table operations
  (there is no StreamData here).

  Seeds: `seed/0` is `HEFT_CONTRACT_SEED` when set, else ExUnit's `--seed`
  (which ExUnit prints after every run), so a failure replays with either.
  `seed_rand/2` seeds `:rand` in the calling process from the base seed and a
  run number, so each random sequence is reproducible on its own.

  Operations are plain data (see `op/1`), generated before they run, so a
  failing sequence can be printed, replayed and shrunk. `type` is a parameter
  everywhere: the later table types (:ordered_set, :bag, :duplicate_bag) reuse
  the same generators.
  """

  # The keys of the last objects generated: key/0 returns one of them half of
  # the time, so that operations mostly hit records that exist.
  @recent :heft_contract_gen_recent_keys

  @doc "The base seed: HEFT_CONTRACT_SEED, else ExUnit's seed."
  def seed do
    case System.get_env("HEFT_CONTRACT_SEED") do
      nil -> ExUnit.configuration()[:seed]
      text -> String.to_integer(String.trim(text))
    end
  end

  @doc "Seeds :rand in this process for run number `run` of base seed `seed`."
  def seed_rand(seed, run) do
    Process.delete(@recent)
    :rand.seed(:exsss, {seed, run, 0x4845_4654})
  end

  @doc "An integer in `range`."
  def int(range), do: Enum.random(range)

  @doc "True with probability `p`."
  def chance(p), do: :rand.uniform() < p

  @doc "One element of `list`."
  def pick(list), do: Enum.random(list)

  @doc "Picks among `{weight, fun}` pairs, calling the chosen zero-arity fun."
  def weighted(choices) do
    total = choices |> Enum.map(&elem(&1, 0)) |> Enum.sum()
    pick_weighted(choices, :rand.uniform(total))
  end

  defp pick_weighted([{w, f} | _], n) when n <= w, do: f.()
  defp pick_weighted([{w, _} | rest], n), do: pick_weighted(rest, n - w)

  # ---------------------------------------------------------------------------
  # Terms

  @big_bin :binary.copy(<<"0123456789abcdef">>, 8)

  @doc """
  Edge-case terms, all distinct under `===`: every kind of term the BEAM has,
  in the representations that tend to break serializers (sub-binaries, refc
  binaries, bitstrings, large maps, bignums, unicode atoms, improper lists).
  The deep list is separate (`deep_list/1`): it is slow to print.
  """
  def interesting_terms do
    [
      0,
      1,
      -1,
      255,
      2 ** 27 - 1,
      -(2 ** 27),
      2 ** 59,
      2 ** 63,
      2 ** 64,
      -(2 ** 64),
      2 ** 300,
      -(2 ** 300),
      1.0,
      -1.5,
      0.1,
      1.0e308,
      -1.0e-308,
      5.0e-324,
      0.0,
      :a,
      :"",
      :"a b",
      :ünïcödé,
      :日本語,
      :"😀",
      true,
      false,
      nil,
      "",
      "a",
      "ünï",
      binary_part("hello world", 6, 5),
      @big_bin,
      binary_part(@big_bin, 1, 100),
      :binary.copy(<<0>>, 65),
      <<1::1>>,
      <<255, 7::3>>,
      sub_bitstring(),
      {},
      {1},
      {1, 2.0, "3"},
      {{{}}},
      List.to_tuple(Enum.to_list(1..300)),
      [],
      [1, 2],
      [1 | 2],
      [[] | []],
      [1, 2 | 3],
      ~c"chars",
      [:a, [:b, [:c, []]]],
      %{},
      %{a: 1},
      %{1 => 1, 1.0 => 2},
      %{%{1 => 2} => [3], {} => %{}},
      large_map(),
      self(),
      :erlang.list_to_pid(~c"<0.0.0>"),
      make_ref(),
      :erlang.list_to_port(~c"#Port<0.1>"),
      &Enum.map/2,
      fn x -> x end,
      closure(@big_bin)
    ]
  end

  defp sub_bitstring do
    <<_::5, rest::bitstring>> = @big_bin
    rest
  end

  defp closure(captured), do: fn -> captured end

  @doc "A map of more than 32 keys (a HAMT, not a flat map)."
  def large_map(n \\ 40), do: Map.new(1..n, &{&1, Integer.to_string(&1)})

  @doc "The same large map, built in the opposite key order."
  def large_map_reversed(n \\ 40),
    do: Enum.reduce(n..1//-1, %{}, &Map.put(&2, &1, Integer.to_string(&1)))

  @doc "A list nested `depth` levels: [[[...[:bottom]...]]]."
  def deep_list(depth), do: Enum.reduce(1..depth, [:bottom], fn _, acc -> [acc] end)

  @doc "A tuple nested `depth` levels: {{{...{:bottom}...}}}."
  def deep_tuple(depth), do: Enum.reduce(1..depth, {:bottom}, fn _, acc -> {acc} end)

  # ---------------------------------------------------------------------------
  # Random keys, values, objects

  @doc """
  A random key: half of the time one of the recent objects' keys, else a
  fresh one from a small pool (so that operations collide), mixing kinds
  that compare equal under == but not under match: 1 / 1.0, 0.0 / -0.0.
  """
  def key(p_recent \\ 0.5) do
    case Process.get(@recent, []) do
      [] -> fresh_key()
      recent -> if chance(p_recent), do: pick(recent), else: fresh_key()
    end
  end

  @doc "A random key, not biased towards the keys of recent objects."
  def fresh_key do
    weighted([
      {30, fn -> int(-2..6) end},
      {8, fn -> pick([1.0, 0.0, -0.0, 2.5, -1.0]) end},
      {8, fn -> pick([:a, :b, :ünï, nil, true]) end},
      {8, fn -> pick(["", "a", "ab", @big_bin, binary_part(@big_bin, 16, 80), <<1::3>>]) end},
      {6, fn -> pick([{}, {1}, {1.0}, {:a, 1}, {1, {2, 3}}]) end},
      {6, fn -> pick([[], [1], [1.0], [1 | 2], ~c"ab", [[]]]) end},
      {3, fn -> pick([%{}, %{a: 1}, %{1 => :a}, %{1.0 => :a}]) end},
      {2, fn -> pick([2 ** 64, -(2 ** 64)]) end},
      {3, fn -> {fresh_key(), fresh_key()} end},
      {2, fn -> [fresh_key() | fresh_key()] end}
    ])
  end

  @doc "A random value: mostly small integers (counters), else keys or nestings."
  def value do
    weighted([
      {75, fn -> int(-3..10) end},
      {20, &fresh_key/0},
      {5, fn -> 2 ** 62 + int(-2..2) end},
      {5, fn -> pick([1.5, :x, "str"]) end},
      {2, &large_value/0},
      {5, fn -> {value(), value()} end},
      {5, fn -> [value(), value()] end}
    ])
  end

  @doc "A large binary: compressible (a repeated byte) or not (random bytes)."
  def large_value do
    size = int(100..40_000)
    if chance(0.5), do: :binary.copy(<<int(0..255)>>, size), else: :rand.bytes(size)
  end

  @doc "A valid object for keypos `keypos` with key `key`: arity keypos..keypos+3."
  def object(keypos, key \\ key()) do
    Process.put(@recent, Enum.take([key | Process.get(@recent, [])], 16))
    arity = keypos + pick([0, 1, 2, 2, 3, 3])
    List.to_tuple(for i <- 1..arity, do: if(i == keypos, do: key, else: value()))
  end

  @doc "Something insert/delete_object must reject."
  def bad_object(keypos) do
    pick([:not_a_tuple, {}, [], 42] ++ if(keypos > 1, do: [{key()}], else: []))
  end

  @doc "A valid insert/insert_new argument: one object or a list (maybe with repeats)."
  def objects(keypos) do
    weighted([
      {70, fn -> object(keypos) end},
      {25, fn -> for _ <- 1..int(0..4)//1, do: object(keypos) end},
      {5,
       fn ->
         Enum.shuffle([bad_object(keypos) | for(_ <- 1..int(0..2)//1, do: object(keypos))])
       end}
    ])
  end

  # update_counter/update_element arguments: positions around the valid range
  # (0, keypos, past the arity) so that errors are generated too.
  defp pos(keypos),
    do:
      weighted([
        {85, fn -> int(1..(keypos + 3)) end},
        {5, fn -> 0 end},
        {10, fn -> keypos + int(4..5) end}
      ])

  defp incr,
    do:
      weighted([
        {85, fn -> int(-3..3) end},
        {10, fn -> 2 ** 62 end},
        {5, fn -> pick([1.0, :a]) end}
      ])

  @doc "A random update_counter operation (any form, including lists and bad ones)."
  def counter_op(keypos) do
    weighted([
      {25, &incr/0},
      {35, fn -> {pos(keypos), incr()} end},
      {20, fn -> {pos(keypos), incr(), int(-5..8), int(-2..4)} end},
      {15, fn -> for _ <- 1..int(0..3)//1, do: counter_op_single(keypos) end},
      {5, fn -> pick([{2}, {2, 1, 2}, :bad, {2, 1, :thr, 0}, {2, 1, 3, :set}]) end}
    ])
  end

  defp counter_op_single(keypos) do
    if chance(0.5), do: {pos(keypos), incr()}, else: {pos(keypos), incr(), int(-5..8), int(-2..4)}
  end

  @doc """
  A default object for update_counter/4. Never a tuple shorter than keypos:
  OTP 25's ETS inserts such a default as a keyless record and later corrupts
  memory (erlang/otp#10603); see differences_test.exs.
  """
  def default_object(keypos) do
    weighted([
      {80,
       fn ->
         List.to_tuple(
           for i <- 1..(keypos + int(0..3)), do: if(i == keypos, do: key(), else: int(0..3))
         )
       end},
      {10, fn -> object(keypos) end},
      {10, fn -> pick([:bad, [], %{}, Tuple.duplicate(:only, keypos)]) end}
    ])
  end

  @doc "A random update_element spec: {pos, value} or a list of them."
  def element_spec(keypos) do
    weighted([
      {60, fn -> {pos(keypos), value()} end},
      {30, fn -> for _ <- 1..int(0..3)//1, do: {pos(keypos), value()} end},
      {10, fn -> pick([:bad, {2}, {2, :a, :b}]) end}
    ])
  end

  @doc """
  A random operation, as data. `keypos` is the table's; `type` is reserved for
  the later table types (a bag will add its own mix here).
  """
  def op(_type, keypos) do
    weighted([
      {18, fn -> {:insert, objects(keypos)} end},
      {8, fn -> {:insert_new, objects(keypos)} end},
      {8, fn -> {:delete, key()} end},
      {5, fn -> {:delete_object, delete_object_arg(keypos)} end},
      {4, fn -> {:delete_existing_object, int(0..20)} end},
      {5, fn -> {:take, key()} end},
      {12, fn -> {:update_counter, key(0.85), counter_op(keypos)} end},
      {6, fn -> {:update_counter, key(), counter_op(keypos), default_object(keypos)} end},
      {8, fn -> {:update_element, key(0.85), element_spec(keypos)} end},
      {10, fn -> {:lookup, key()} end},
      {5, fn -> {:member, key()} end},
      {6, fn -> {:lookup_element, key(0.85), pos(keypos)} end},
      {3, fn -> {:traverse} end},
      {2, fn -> {:tab2list} end},
      {2, fn -> {:foldl} end},
      {1, fn -> {:size} end},
      {1, fn -> {:delete_all_objects} end},
      {1, fn -> {:bulk_insert, int(0..5) * 1000, int(1..800)} end},
      {1, fn -> {:bulk_delete, int(0..5) * 1000, int(1..800)} end}
    ])
  end

  defp delete_object_arg(keypos) do
    weighted([{80, fn -> object(keypos) end}, {20, fn -> bad_object(keypos) end}])
  end

  @doc "A list of `n` random operations."
  def ops(type, keypos, n), do: for(_ <- 1..n//1, do: op(type, keypos))
end
