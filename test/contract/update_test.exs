defmodule Heft.Contract.UpdateTest do
  @moduledoc "update_counter/3,4 and update_element/3 on a :set table."
  use Heft.Contract.Case, async: true

  describe "update_counter/3" do
    contract "a bare integer increments the element after the key" do
      tab = new_with(m, {:k, 10, 20})
      assert m.update_counter(tab, :k, 5) == 15
      assert m.update_counter(tab, :k, -20) == -5
      assert m.update_counter(tab, :k, 0) == -5
      assert m.lookup(tab, :k) == [{:k, -5, 20}]
    end

    contract "with keypos 2 a bare integer increments element 3" do
      tab = new_with(m, {1, :k, 100}, [{:keypos, 2}])
      assert m.update_counter(tab, :k, 1) == 101
      assert m.lookup(tab, :k) == [{1, :k, 101}]
      assert m.update_counter(tab, :k, {1, 1}) == 2
    end

    contract "{pos, incr} increments that position" do
      tab = new_with(m, {:k, 1, 2, 3})
      assert m.update_counter(tab, :k, {3, 10}) == 12
      assert m.update_counter(tab, :k, {4, -4}) == -1
      assert m.lookup(tab, :k) == [{:k, 1, 12, -1}]
    end

    contract "a list of operations returns a list of results, applied in order" do
      tab = new_with(m, {:k, 0, 0})
      assert m.update_counter(tab, :k, [{2, 1}, {3, 5}, {2, 1}]) == [1, 5, 2]
      assert m.lookup(tab, :k) == [{:k, 2, 5}]
      assert m.update_counter(tab, :k, []) == []
      assert m.lookup(tab, :k) == [{:k, 2, 5}]
    end

    contract "threshold wraps upward: result > threshold becomes setvalue" do
      tab = new_with(m, {:k, 8})
      assert m.update_counter(tab, :k, {2, 1, 10, 0}) == 9
      assert m.update_counter(tab, :k, {2, 1, 10, 0}) == 10
      assert m.update_counter(tab, :k, {2, 1, 10, 0}) == 0
      assert m.update_counter(tab, :k, {2, 100, 10, -7}) == -7
    end

    contract "threshold wraps downward: incr < 0 and result < threshold becomes setvalue" do
      tab = new_with(m, {:k, 2})
      assert m.update_counter(tab, :k, {2, -1, 0, 9}) == 1
      assert m.update_counter(tab, :k, {2, -1, 0, 9}) == 0
      assert m.update_counter(tab, :k, {2, -1, 0, 9}) == 9
      assert m.update_counter(tab, :k, {2, -100, 5, 123}) == 123
    end

    contract "incr 0 counts as upward: wraps when the value is already above threshold" do
      tab = new_with(m, {:k, 5})
      assert m.update_counter(tab, :k, {2, 0, 5, 1}) == 5
      assert m.update_counter(tab, :k, {2, 0, 4, 1}) == 1
      assert m.update_counter(tab, :k, {2, 0, 3, 1}) == 1
    end

    contract "the threshold test depends only on the sign of incr" do
      # incr < 0 checks only "result < threshold": a value far above a high
      # threshold is not wrapped while decrementing.
      tab = new_with(m, {:k, 100})
      assert m.update_counter(tab, :k, {2, -1, 10, 0}) == 99
      # incr > 0 checks only "result > threshold": a value far below a low
      # threshold is not wrapped while incrementing.
      m.insert(tab, {:k, -100})
      assert m.update_counter(tab, :k, {2, 1, -10, 0}) == -99
    end

    contract "counters become big integers and back, in both signs" do
      tab = new_with(m, {:k, 2 ** 62 - 1, -(2 ** 62)})
      assert m.update_counter(tab, :k, {2, 1}) == 2 ** 62
      assert m.update_counter(tab, :k, {2, 2 ** 70}) == 2 ** 62 + 2 ** 70
      assert m.update_counter(tab, :k, {2, -(2 ** 70)}) == 2 ** 62
      assert m.update_counter(tab, :k, {3, -1}) == -(2 ** 62) - 1
      assert m.update_counter(tab, :k, {3, -(2 ** 100)}) == -(2 ** 62) - 1 - 2 ** 100
      assert m.update_counter(tab, :k, {2, 1, 2 ** 80, -(2 ** 80)}) == 2 ** 62 + 1
      m.insert(tab, {:k, 2 ** 80, 0})
      assert m.update_counter(tab, :k, {2, 1, 2 ** 80, -(2 ** 80)}) == -(2 ** 80)
      assert m.lookup(tab, :k) == [{:k, -(2 ** 80), 0}]
    end

    contract "missing key without default raises" do
      tab = new_with(m, {1, 0})
      assert_raise ArgumentError, fn -> m.update_counter(tab, :missing, 1) end
      assert_raise ArgumentError, fn -> m.update_counter(tab, 1.0, 1) end
      assert contents(m, tab) == [{1, 0}]
    end

    contract "updating the key position raises" do
      tab = new_with(m, {1, 0})
      assert_raise ArgumentError, fn -> m.update_counter(tab, 1, {1, 1}) end
      tab2 = new_with(m, {0, 1, 0}, [{:keypos, 2}])
      assert_raise ArgumentError, fn -> m.update_counter(tab2, 1, {2, 1}) end
      assert m.update_counter(tab2, 1, {1, 1}) == 1
    end

    contract "position out of range raises and changes nothing" do
      tab = new_with(m, {:k, 0, 0})

      for op <- [{0, 1}, {-1, 1}, {4, 1}, {100, 1}, [{2, 1}, {4, 1}], [{2, 1}, {0, 1}]] do
        assert_raise ArgumentError, fn -> m.update_counter(tab, :k, op) end
      end

      assert m.lookup(tab, :k) == [{:k, 0, 0}]
      tab2 = new_with(m, {:only_key})
      assert_raise ArgumentError, fn -> m.update_counter(tab2, :only_key, 1) end
    end

    contract "non-integer counters raise and change nothing" do
      tab = new_with(m, {:k, 1.0, :a, "1", 5})

      for pos <- [2, 3, 4] do
        assert_raise ArgumentError, fn -> m.update_counter(tab, :k, {pos, 1}) end
      end

      assert_raise ArgumentError, fn -> m.update_counter(tab, :k, [{5, 1}, {2, 1}]) end
      assert m.lookup(tab, :k) == [{:k, 1.0, :a, "1", 5}]
    end

    contract "ill-formed operations raise" do
      tab = new_with(m, {:k, 0, 0})

      bad_ops = [
        1.0,
        :one,
        "1",
        {2},
        {2, 1.5},
        {2, :a},
        {2, 1, 3},
        {2, 1, 3, 0, 0},
        {2, 1, :thr, 0},
        {2, 1, 3, :set},
        {2, 1, 3.0, 0},
        {:two, 1},
        [{2, 1} | :tail],
        [1],
        [{2, 1}, :bad]
      ]

      for op <- bad_ops do
        assert_raise ArgumentError, fn -> m.update_counter(tab, :k, op) end
      end

      assert m.lookup(tab, :k) == [{:k, 0, 0}]
    end
  end

  describe "update_counter/4 (default object)" do
    contract "missing key: the default is inserted, then updated" do
      tab = new(m)
      assert m.update_counter(tab, :k, 1, {:k, 10}) == 11
      assert m.lookup(tab, :k) == [{:k, 11}]
      assert m.update_counter(tab, :k, 1, {:k, 10}) == 12
    end

    contract "the default's key element is replaced by the key" do
      tab = new(m, [{:keypos, 2}])
      assert m.update_counter(tab, :k, {3, 1}, {:a, :ignored, 5}) == 6
      assert m.lookup(tab, :k) == [{:a, :k, 6}]
      assert m.lookup(tab, :ignored) == []
    end

    contract "existing key: the default is ignored (even a shorter one)" do
      tab = new_with(m, {:k, 1, 1})
      assert m.update_counter(tab, :k, {3, 1}, {:k, 100, 100}) == 2
      assert m.update_counter(tab, :k, {3, 1}, {:k}) == 3
      assert m.lookup(tab, :k) == [{:k, 1, 3}]
    end

    contract "list of operations and thresholds apply to the default" do
      tab = new(m)
      assert m.update_counter(tab, :k, [{2, 1}, {3, 5, 4, -1}], {:k, 0, 0}) == [1, -1]
      assert m.lookup(tab, :k) == [{:k, 1, -1}]
    end

    contract "a default that is not a tuple raises, whether or not the key exists" do
      tab = new_with(m, {:k, 0})

      for default <- [:bad, [], [{:x, 0}], %{}] do
        assert_raise ArgumentError, fn -> m.update_counter(tab, :k, 1, default) end
        assert_raise ArgumentError, fn -> m.update_counter(tab, :new, 1, default) end
      end

      assert contents(m, tab) == [{:k, 0}]
    end

    contract "a default too short for the position, or with a non-integer there, raises and inserts nothing" do
      tab = new(m)
      assert_raise ArgumentError, fn -> m.update_counter(tab, :k, {3, 1}, {:k, 0}) end
      assert_raise ArgumentError, fn -> m.update_counter(tab, :k, {2, 1}, {:k, :x}) end
      assert_raise ArgumentError, fn -> m.update_counter(tab, :k, {1, 1}, {:k, 0}) end
      assert_raise ArgumentError, fn -> m.update_counter(tab, :k, [{2, 1}, {3, 1}], {:k, 0}) end
      assert m.tab2list(tab) == []
    end
  end

  describe "update_element/3" do
    contract "{pos, value} replaces one element and returns true" do
      tab = new_with(m, {:k, :a, :b})
      assert m.update_element(tab, :k, {3, [:new]}) == true
      assert m.lookup(tab, :k) == [{:k, :a, [:new]}]
    end

    contract "a list of {pos, value} applies in order (the last write wins)" do
      tab = new_with(m, {:k, :a, :b})
      assert m.update_element(tab, :k, [{2, 1}, {3, 2}, {2, 3}]) == true
      assert m.lookup(tab, :k) == [{:k, 3, 2}]
      assert m.update_element(tab, :k, []) == true
      assert m.lookup(tab, :k) == [{:k, 3, 2}]
    end

    contract "missing key: false, and nothing is inserted" do
      tab = new_with(m, {:k, :a})
      assert m.update_element(tab, :missing, {2, :x}) == false
      assert m.update_element(tab, :missing, []) == false
      assert m.update_element(tab, 1.0, {2, :x}) == false
      assert contents(m, tab) == [{:k, :a}]
    end

    # Observed on OTP 25: the key is looked up before the update spec is
    # checked, so a missing key returns false even for a spec that would
    # raise on an existing key.
    contract "missing key: false even for a spec that is invalid" do
      tab = new(m)

      for spec <- [{1, :x}, {0, :x}, {99, :x}, {:a, :x}, :bad, [{2, :x} | :tail], {2, :x, :y}] do
        assert m.update_element(tab, :missing, spec) == false
      end

      assert m.tab2list(tab) == []
    end

    contract "updating the key position raises, even to the same value" do
      tab = new_with(m, {:k, :a})
      assert_raise ArgumentError, fn -> m.update_element(tab, :k, {1, :k}) end
      assert_raise ArgumentError, fn -> m.update_element(tab, :k, {1, :other}) end
      assert_raise ArgumentError, fn -> m.update_element(tab, :k, [{2, :x}, {1, :k}]) end
      tab2 = new_with(m, {:a, :k}, [{:keypos, 2}])
      assert_raise ArgumentError, fn -> m.update_element(tab2, :k, {2, :k}) end
      assert m.update_element(tab2, :k, {1, :b}) == true
      assert m.lookup(tab2, :k) == [{:b, :k}]
      assert m.lookup(tab, :k) == [{:k, :a}]
    end

    contract "position out of range or ill-formed spec raises, atomically" do
      tab = new_with(m, {:k, :a, :b})

      for spec <- [
            {0, :x},
            {-1, :x},
            {4, :x},
            {:two, :x},
            {2},
            {2, :x, :y},
            :bad,
            [{2, :x} | :t],
            [{2, :x}, {4, :y}]
          ] do
        assert_raise ArgumentError, fn -> m.update_element(tab, :k, spec) end
      end

      assert m.lookup(tab, :k) == [{:k, :a, :b}]
    end

    contract "the new value may be any term, and may make the record larger" do
      tab = new_with(m, {:k, 0})
      big = :binary.copy("x", 100_000)
      assert m.update_element(tab, :k, {2, big}) == true
      assert m.lookup_element(tab, :k, 2) == big
      assert m.update_element(tab, :k, {2, 0}) == true
      assert m.lookup(tab, :k) == [{:k, 0}]
    end
  end

  # ETS has these from OTP 26 (lookup_element/4) and 27 (update_element/4);
  # Heft on every release. On an older VM the :ets side is skipped.
  describe "update_element/4 (default object)" do
    contract "missing key: the default, its key replaced, is inserted updated",
      functions: [update_element: 4] do
      tab = new_with(m, {:k, 1, 2})
      assert m.update_element(tab, :m1, {2, :x}, {:a, :b, :c}) == true
      assert m.lookup(tab, :m1) == [{:m1, :x, :c}]
      assert m.update_element(tab, :m2, [{2, :x}, {3, :y}, {2, :z}], {:a, :b, :c}) == true
      assert m.lookup(tab, :m2) == [{:m2, :z, :y}]
      assert m.update_element(tab, :m3, [], {:a, :b}) == true
      assert m.lookup(tab, :m3) == [{:m3, :b}]
    end

    contract "existing key: updated, a default without a key ignored (OTP 27) or refused (OTP 29)",
      functions: [update_element: 4] do
      tab = new_with(m, {:k, 1, 2})

      if Heft.VM.fact(:update_default_checked) do
        assert_raise ArgumentError, fn -> m.update_element(tab, :k, {2, :y}, {}) end
        assert m.lookup(tab, :k) == [{:k, 1, 2}]
        assert m.update_element(tab, :k, {3, :z}, {:a, :b}) == true
        assert m.lookup(tab, :k) == [{:k, 1, :z}]
      else
        assert m.update_element(tab, :k, {2, :y}, {}) == true
        assert m.update_element(tab, :k, {3, :z}, {:a, :b}) == true
        assert m.lookup(tab, :k) == [{:k, :y, :z}]
      end
    end

    contract "a default that does not fit, or is no tuple, raises and inserts nothing",
      functions: [update_element: 4] do
      tab = new_with(m, {:k, 1, 2})
      assert_raise ArgumentError, fn -> m.update_element(tab, :m, {3, :x}, {:a, :b}) end
      assert_raise ArgumentError, fn -> m.update_element(tab, :m, {1, :x}, {:a, :b}) end
      assert_raise ArgumentError, fn -> m.update_element(tab, :m, {2, :x}, :nope) end
      assert_raise ArgumentError, fn -> m.update_element(tab, :k, {2, :x}, :nope) end
      assert m.tab2list(tab) == [{:k, 1, 2}]
    end

    contract "an improper or bad list of updates raises and changes nothing",
      functions: [update_element: 4] do
      tab = new_with(m, {:k, 1, 2})

      for updates <- [[{2, 1} | {3, 1}], [{2, 1} | :x], [{2, 1}, false], [false | {2, 1}]],
          key <- [:k, :m] do
        assert_raise ArgumentError, fn -> m.update_element(tab, key, updates, {:m, 0, 0}) end
      end

      assert m.tab2list(tab) == [{:k, 1, 2}]
    end

    contract "a bag raises", functions: [update_element: 4] do
      tab = new_with(m, {:k, 1}, [:bag])
      assert_raise ArgumentError, fn -> m.update_element(tab, :k, {2, 0}, {:a, :b}) end
      assert_raise ArgumentError, fn -> m.update_element(tab, :m, {2, 0}, {:a, :b}) end
    end
  end

  describe "lookup_element/4 (default)" do
    contract "the default for a missing key, whatever the position",
      functions: [lookup_element: 4] do
      tab = new_with(m, {:k, 1, 2})
      assert m.lookup_element(tab, :k, 2, :def) == 1
      assert m.lookup_element(tab, :nokey, 2, :def) == :def
      assert m.lookup_element(tab, :nokey, 99, :def) == :def
      assert_raise ArgumentError, fn -> m.lookup_element(tab, :k, 99, :def) end
      assert_raise ArgumentError, fn -> m.lookup_element(tab, :nokey, 0, :def) end
      assert_raise ArgumentError, fn -> m.lookup_element(tab, :nokey, :x, :def) end
    end

    contract "a bag answers a list; one short object raises", functions: [lookup_element: 4] do
      tab = new_with(m, [{:k, 1}, {:k, 2, 3}, {:one, 1}], [:bag])
      assert Enum.sort(m.lookup_element(tab, :k, 2, :d)) == [1, 2]
      assert m.lookup_element(tab, :one, 2, :d) == [1]
      assert_raise ArgumentError, fn -> m.lookup_element(tab, :k, 3, :d) end
    end
  end
end
