defmodule Heft.VM do
  # The ETS semantics of the VM Heft runs on. Heft follows the ETS of the
  # running VM, not the one it was compiled on, and what changed between
  # OTP releases is learnt here by asking ETS itself, once, when the NIF
  # loads (Heft.Native.load_nif/0), rather than from version numbers:
  #
  #   neg_zero_is_zero      0.0 =:= -0.0, so one key in every table (OTP 26
  #                         and older); the NIF canonicalises keys by it
  #                         (native/heft_nif/src/codec.rs)
  #   bag_batch_reversed    a bag takes a list given to insert/2 last
  #                         object first (OTP 26 and older); the NIF
  #                         reverses a bag's batch by it (ops.rs)
  #   map_key_is_pattern    a map in a key of a match pattern matches
  #                         larger maps, so such a key is not looked up
  #                         (OTP 27 and later); Heft.MatchSpec.plan/3
  #   fold_end_of_table     what foldl/3 and foldr/3 do at an object whose
  #                         key is :"$end_of_table", per walk (:hash for
  #                         set and bags, :ordered): :stop (OTP 26 and
  #                         older: the walk ends there), :visit (a walk
  #                         like any other) or :raise (the objects of that
  #                         key are folded, then badarg: OTP 27's ordered_set)
  #   heir_without_data     {:heir, pid} is an option of new/2 and
  #                         setopts/2 (OTP 29)
  #   update_default_checked  update_element/4 refuses a default without
  #                         an element at the keypos even when the key
  #                         exists (OTP 29; OTP 27 ignores it then)
  #
  # A persistent table records the rules that shape its stored keys
  # (neg_zero_is_zero) in its files, so that a table written under one rule
  # is read correctly under the other (docs/persistence-format.md).
  @moduledoc false

  @key {__MODULE__, :facts}

  @type facts :: %{
          neg_zero_is_zero: boolean,
          bag_batch_reversed: boolean,
          map_key_is_pattern: boolean,
          fold_end_of_table: %{hash: fold, ordered: fold},
          heir_without_data: boolean,
          update_default_checked: boolean
        }
  @type fold :: :stop | :visit | :raise

  @doc false
  # Asks ETS; cached for the life of the VM (the facts cannot change).
  @spec facts() :: facts
  def facts do
    case :persistent_term.get(@key, nil) do
      nil ->
        facts = probe()
        :persistent_term.put(@key, facts)
        facts

      facts ->
        facts
    end
  end

  @spec fact(atom) :: term
  def fact(name), do: Map.fetch!(facts(), name)

  @doc false
  # For tests only: runs `fun` as on a VM where 0.0 and -0.0 are one key
  # (`merged`) or not, for Heft's own rule (the NIF's and these facts;
  # :ets keeps the VM's). Not safe while other processes use Heft tables.
  def with_zero_rule(merged, fun) do
    facts = facts()
    was = Heft.Native.set_zero_rule(merged)
    :persistent_term.put(@key, %{facts | neg_zero_is_zero: merged})

    try do
      fun.()
    after
      Heft.Native.set_zero_rule(was)
      :persistent_term.put(@key, facts)
    end
  end

  defp probe do
    negative_zero = :erlang.list_to_float(~c"-0.0")

    %{
      neg_zero_is_zero: 0.0 === negative_zero,
      bag_batch_reversed: bag_batch_reversed?(),
      map_key_is_pattern: map_key_is_pattern?(),
      fold_end_of_table: %{
        hash: fold_end_of_table(:set),
        ordered: fold_end_of_table(:ordered_set)
      },
      heir_without_data: heir_without_data?(),
      update_default_checked: update_default_checked?()
    }
  end

  defp with_table(opts, fun) do
    t = :ets.new(:heft_vm_probe, opts)

    try do
      fun.(t)
    after
      :ets.delete(t)
    end
  end

  defp update_default_checked? do
    with_table([:set], fn t ->
      :ets.insert(t, {:k, 1})

      try do
        apply(:ets, :update_element, [t, :k, {2, :y}, {}])
        false
      rescue
        ArgumentError -> true
        UndefinedFunctionError -> false
      end
    end)
  end

  defp bag_batch_reversed? do
    with_table([:bag], fn t ->
      :ets.insert(t, [{:k, 1}, {:k, 2}])
      :ets.lookup(t, :k) == [{:k, 2}, {:k, 1}]
    end)
  end

  defp map_key_is_pattern? do
    with_table([:set], fn t ->
      :ets.insert(t, {%{a: 1, b: 2}})
      :ets.select(t, [{{%{a: 1}}, [], [true]}]) == [true]
    end)
  end

  defp fold_end_of_table(type) do
    with_table([type], fn t ->
      :ets.insert(t, {:"$end_of_table"})

      try do
        case :ets.foldl(fn _, n -> n + 1 end, 0, t) do
          0 -> :stop
          1 -> :visit
        end
      rescue
        ArgumentError -> :raise
      end
    end)
  end

  # The probe makes the call that OTP 25's contract of :ets.new/2 forbids.
  @dialyzer {:no_fail_call, heir_without_data?: 0}
  defp heir_without_data? do
    t = :ets.new(:heft_vm_probe, [{:heir, self()}])
    :ets.delete(t)
    true
  rescue
    ArgumentError -> false
  end
end
