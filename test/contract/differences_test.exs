defmodule Heft.Contract.DifferencesTest do
  @moduledoc """
  ===========================================================================
  DELIBERATE DIFFERENCES between :ets and Heft: the one place where a test
  expects different results per backend. Each difference is stated by a test
  that asserts each side's behaviour. Everywhere else in test/contract the
  two must behave identically (exceptions compared by type only).

    1. info(tab, :memory) is in BYTES for Heft, in WORDS for :ets.
    2. info/1: Heft returns a keyword list with extra Heft keys; the shared
       keys (size type keypos protection named_table name owner heir) agree.
    3. The owner-transfer message is {:"HEFT-TRANSFER", tab, from, data}
       instead of {:"ETS-TRANSFER", tab, from, data}.
    4. new/2 of an unnamed table returns a %Heft.Table{} struct, not a
       reference; a named table returns its name in both.
    5. next/2 on a key that is not in a set: :ets raises ArgumentError (the
       key must exist unless the table is fixed with safe_fixtable); Heft
       continues from where the key would be, fixed or not
       (fixation_test.exs has the fixed case, against both). The key
       :"$end_of_table" raises in both.
    6. Heft-only options (compression, compression_level, arena): :ets
       rejects them; Heft rejects ill-typed ones with an ArgumentError that
       names the option.
    7. update_counter/4 with a default tuple shorter than keypos: the ETS
       docs say badarg, but OTP 25 inserts it as a keyless record and then
       corrupts memory (erlang/otp#10603, fixed upstream in OTP 28/29). Heft
       raises ArgumentError; the :ets side is not run (it can crash the VM).
    8. stream/1 exists only in Heft.
    9. (none: foldl/3 at the key :"$end_of_table" differs between OTP
       releases, and Heft follows the running VM's ETS; see
       test/heft/vm_semantics_test.exs.)
   10. info(tab, :heir) once the heir has exited: OTP 25's ETS still
       names the dead pid; Heft says :none (no one will inherit).
   11. Tuning items of info/2: Heft's :compressed is true unless the table
       has compression: :none (ETS: only with :compressed), and its
       :read_concurrency is always true (readers share a lock); ETS reports
       the options given.
   12. init_table/2: Heft raises ArgumentError where ETS exits (an object
       that does not fit: ETS exits with {:badarg, _}; a fun returning
       something else: ETS exits with that value); a non-function is
       refused before anything is deleted (ETS deletes, then fails with
       :badfun).
   13. tabfile_info/1 of Heft's file format (of ETS's files it answers as
       ETS: tab_file_test.exs): :extended_info is
       [:object_count], :version is Heft's format version, and errors are
       file2tab's reasons ({:error, :enoent}...; ETS: {:error,
       {:read_error, _}}). It takes a binary path too (ETS: charlists).
   14. repair_continuation/2 of something that is not a continuation:
       ArgumentError (ETS: FunctionClauseError).
   15. to_dets/2 of objects the dets table cannot take (its keypos beyond
       them): ArgumentError (ETS: ErlangError :invalid_objects_list, and
       the dets table is left refusing every call until reopened).
   16. info(tab, :binary): Heft holds no reference-counted binaries (it
       copies them into its arena), so the list is always [].
   17. The heir's mailbox when a linked owner dies: :ets queues the
       transfer message before the owner's EXIT; Heft's may come after it
       (a NIF hears of the death after the links' EXITs are sent), but
       the heir owns the table when it sees the EXIT: owner_exit_test.exs.
  (Traversal order of a set is unspecified in both: every test compares
  traversals as sorted lists; that is not a difference.)
  ===========================================================================
  """
  use Heft.Contract.Case, async: true

  @shared_info [:size, :type, :keypos, :protection, :named_table, :name, :owner, :heir]
  @ets_info_keys [
    :id,
    :decentralized_counters,
    :read_concurrency,
    :write_concurrency,
    :compressed,
    :memory,
    :owner,
    :heir,
    :name,
    :size,
    :node,
    :named_table,
    :type,
    :keypos,
    :protection
  ]

  describe "1. info(tab, :memory) unit" do
    contract ":ets counts words: 1000 records of 100 small integers take 100_000..150_000",
      only: :ets do
      tab = new(m)
      before = m.info(tab, :memory)
      m.insert(tab, for(i <- 1..1000, do: List.to_tuple([i | Enum.to_list(1..99)])))
      grown = m.info(tab, :memory) - before
      assert grown in 100_000..150_000
    end

    contract "Heft counts bytes: 1000 records of 1000 random bytes take >= 1_000_000",
      only: Heft do
      tab = new(m)
      before = m.info(tab, :memory)
      assert is_integer(before) and before >= 0
      m.insert(tab, for(i <- 1..1000, do: {i, :crypto.strong_rand_bytes(1000)}))
      grown = m.info(tab, :memory) - before
      # incompressible payload: a words count would be ~8x smaller
      assert grown >= 1_000_000
      assert grown < 20_000_000
    end
  end

  describe "2. info/1 keys" do
    contract ":ets info/1 has exactly the OTP 25 keys", only: :ets do
      info = m.info(new(m))
      assert Enum.sort(Keyword.keys(info)) == Enum.sort(@ets_info_keys)
    end

    contract "Heft info/1 has the shared keys and :memory, plus Heft keys", only: Heft do
      tab = new_with(m, {1})
      info = m.info(tab)
      assert Keyword.keyword?(info)
      assert Enum.all?(@shared_info ++ [:memory], &Keyword.has_key?(info, &1))
      assert info[:size] == 1
    end
  end

  describe "3. transfer message tag" do
    contract "give_away sends {ETS-TRANSFER | HEFT-TRANSFER, tab, from, data}" do
      tab = new(m)
      receiver = start_process()
      m.give_away(tab, receiver, :data)
      {:ok, {tag, ^tab, from, :data}} = run_in(receiver, fn -> receive(do: (msg -> msg)) end)
      assert from == self()
      assert tag == if(m == :ets, do: :"ETS-TRANSFER", else: :"HEFT-TRANSFER")
      stop(receiver)
    end
  end

  describe "4. what new/2 returns" do
    contract "unnamed: a reference (:ets) or a %Heft.Table{} (Heft); named: the name" do
      tab = new(m)

      if m == :ets do
        assert is_reference(tab)
      else
        assert %{__struct__: Heft.Table} = tab
      end

      name = unique_name()
      assert new(m, name, [:named_table]) == name
    end
  end

  describe "5. next/2 on a key that is not in the table" do
    contract ":ets raises for a missing key, a deleted key, and on an empty table", only: :ets do
      tab = new_with(m, for(i <- 1..20, do: {i}))
      assert_raise ArgumentError, fn -> m.next(tab, :missing) end
      assert_raise ArgumentError, fn -> m.next(tab, 1.0) end
      assert_raise ArgumentError, fn -> m.next(tab, :"$end_of_table") end
      key = m.first(tab)
      m.delete(tab, key)
      assert_raise ArgumentError, fn -> m.next(tab, key) end
      assert_raise ArgumentError, fn -> m.next(new(m), 1) end
    end

    contract "Heft continues from where the key would be", only: Heft do
      tab = new_with(m, for(i <- 1..20, do: {i}))
      keys = MapSet.new(1..20)

      # (Except :"$end_of_table", which raises as in ETS: traversal_test.exs.)
      for missing <- [:missing, 1.0, 0] do
        next = m.next(tab, missing)
        assert next == :"$end_of_table" or next in keys
      end

      assert m.next(new(m), 1) == :"$end_of_table"
    end

    contract "Heft: deleting the current key before next/2 still visits every key once",
      only: Heft do
      tab = new_with(m, for(i <- 1..2_000, do: {i}))

      visited = traversal_with(m, tab, &m.delete(tab, &1))

      assert Enum.sort(visited) == Enum.to_list(1..2_000)
      assert m.tab2list(tab) == []
    end
  end

  describe "6. Heft-only options" do
    contract ":ets rejects the Heft options", only: :ets do
      for opt <- [{:compression, :zlib}, {:compression_level, 5}, {:arena, :memory}] do
        assert_raise ArgumentError, fn -> m.new(:x, [opt]) end
      end
    end

    contract "Heft accepts every valid Heft option", only: Heft do
      dir = Path.join(System.tmp_dir!(), "heft_contract_#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)

      for opts <- [
            [compression: :zlib],
            [compression: :none],
            [compression: :zlib, compression_level: 0],
            [compression: :zlib, compression_level: 9],
            [arena: :memory],
            [arena: {:file, dir}]
          ] do
        tab = m.new(:heft_options, [:public | opts])
        m.insert(tab, {1, :binary.copy("abc", 1000)})
        assert m.lookup(tab, 1) == [{1, :binary.copy("abc", 1000)}]
        m.delete(tab)
      end

      File.rm_rf!(dir)
    end

    contract "Heft: an unknown or ill-typed option raises ArgumentError naming it", only: Heft do
      cases = [
        {[:bogus_option], "bogus_option"},
        {[compression: :brotli], "compression"},
        {[compression: {:zstd, level: 0}], "compression"},
        {[compression: "zlib"], "compression"},
        {[compression_level: 10], "compression_level"},
        {[compression_level: -1], "compression_level"},
        {[compression_level: :max], "compression_level"},
        {[arena: :disk], "arena"},
        {[arena: {:file, 42}], "arena"},
        {[{:keypos, 0}], "keypos"}
      ]

      for {opts, named} <- cases do
        error = assert_raise ArgumentError, fn -> m.new(:x, opts) end
        assert error.message =~ named, "#{inspect(opts)}: #{error.message}"
      end
    end
  end

  describe "7. update_counter/4 with a default shorter than keypos" do
    contract "Heft raises ArgumentError and inserts nothing", only: Heft do
      tab = new(m, [{:keypos, 3}])
      assert_raise ArgumentError, fn -> m.update_counter(tab, :k, {2, 1}, {0, 0}) end
      assert_raise ArgumentError, fn -> m.update_counter(tab, :k, {1, 1}, {0}) end
      tab1 = new(m)
      assert_raise ArgumentError, fn -> m.update_counter(tab1, :k, {2, 1}, {}) end
      assert m.tab2list(tab) == []
      assert m.tab2list(tab1) == []
    end
  end

  describe "8. stream/1" do
    contract ":ets has no stream/1", only: :ets do
      refute function_exported?(m, :stream, 1)
    end

    contract "Heft.stream/1 is a lazy enumerable of the records",
      only: Heft,
      functions: [stream: 1] do
      objects = for i <- 1..1_000, do: {i, Integer.to_string(i)}
      tab = new_with(m, objects)
      stream = m.stream(tab)
      assert Enumerable.impl_for(stream) != nil
      assert canonical_sort(Enum.to_list(stream)) == objects
      assert [{_, _}, {_, _}] = Enum.take(stream, 2)
      assert Enum.count(m.stream(new(m))) == 0
    end

    contract "Heft.stream/1 of a deleted table raises ArgumentError when run",
      only: Heft,
      functions: [stream: 1] do
      tab = new_with(m, {1})
      m.delete(tab)
      assert_raise ArgumentError, fn -> m.stream(tab) |> Enum.to_list() end
    end
  end

  describe "10. info(tab, :heir) of an heir that has exited" do
    contract "ETS names the dead heir; Heft says :none" do
      tab = new(m)
      heir = start_process()
      m.setopts(tab, {:heir, heir, :data})
      assert m.info(tab, :heir) == heir
      stop(heir, :kill)
      assert m.info(tab, :heir) == if(m == :ets, do: heir, else: :none)
    end
  end

  describe "11. tuning items of info/2" do
    contract "a default table: :compressed and :read_concurrency" do
      tab = new(m)
      assert m.info(tab, :compressed) == (m != :ets)
      assert m.info(tab, :read_concurrency) == (m != :ets)
    end

    contract "Heft: :compressed follows the compression option; read_concurrency is always true",
      only: Heft do
      assert m.info(new(m, compression: :none), :compressed) == false
      assert m.info(new(m, [:compressed]), :compressed) == true
      assert m.info(new(m, read_concurrency: false), :read_concurrency) == true
      assert m.info(new(m, write_concurrency: true), :write_concurrency) == false
      assert m.info(new(m, decentralized_counters: true), :decentralized_counters) == false
    end
  end

  describe "12. init_table/2 refusals" do
    contract "a fun returning neither {objects, fun} nor :end_of_input" do
      tab = new_with(m, {:old})
      result = outcome(fn -> m.init_table(tab, fn :read -> :bogus end) end)
      assert result == if(m == :ets, do: {:caught, :exit}, else: {:raise, ArgumentError})
    end

    contract "an object that does not fit" do
      tab = new(m)
      bad = fn :read -> {[:not_a_tuple], fn _ -> :end_of_input end} end
      result = outcome(fn -> m.init_table(tab, bad) end)
      assert result == if(m == :ets, do: {:caught, :exit}, else: {:raise, ArgumentError})
    end

    contract "a non-function: ETS deletes the objects first, Heft deletes nothing" do
      tab = new_with(m, {:old})
      assert {:raise, _} = outcome(fn -> m.init_table(tab, :not_a_fun) end)
      assert m.tab2list(tab) == if(m == :ets, do: [], else: [{:old}])
    end
  end

  describe "13. tabfile_info/1 of Heft's format" do
    contract "Heft: extended_info, version and file2tab's error reasons", only: Heft do
      tab = new_with(m, for(i <- 1..10, do: {i}))
      file = Path.join(System.tmp_dir!(), "#{unique_name()}.tab")
      on_exit(fn -> File.rm(file) end)
      :ok = m.tab2file(tab, file)
      assert {:ok, info} = m.tabfile_info(file)
      assert info[:extended_info] == [:object_count]
      assert info[:version] == {1, 0}
      assert info[:size] == 10
      assert m.tabfile_info(file <> ".missing") == {:error, :enoent}

      File.write!(file, "not a table")
      assert m.tabfile_info(file) == {:error, :badfile}
    end

    contract "Heft: a cut or damaged end frame is an error, not a wrong size", only: Heft do
      tab = new_with(m, for(i <- 1..1_000, do: {i, :crypto.strong_rand_bytes(20)}))
      file = Path.join(System.tmp_dir!(), "#{unique_name()}.tab")
      on_exit(fn -> File.rm(file) end)
      :ok = m.tab2file(tab, file)
      bytes = File.read!(file)
      n = byte_size(bytes)

      File.write!(file, binary_part(bytes, 0, n - 3))
      assert {:error, {:truncated, _}} = m.tabfile_info(file)
      # ... even when the byte that now starts the last 29 is the end
      # frame's tag (it was one file in 256, by chance).
      {before, <<_, after_::binary>>} = :erlang.split_binary(bytes, n - 32)
      File.write!(file, binary_part(IO.iodata_to_binary([before, 0xFF, after_]), 0, n - 3))
      assert {:error, {:truncated, _}} = m.tabfile_info(file)

      # One bit of the object count flipped: its checksum catches it.
      {head, <<count, rest::binary>>} = :erlang.split_binary(bytes, n - 12)
      File.write!(file, [head, <<Bitwise.bxor(count, 1)>>, rest])
      assert {:error, {:corrupt, offset}} = m.tabfile_info(file)
      assert offset == n - 29
    end
  end

  describe "14. repair_continuation/2 of a non-continuation" do
    contract "ETS: FunctionClauseError; Heft: ArgumentError" do
      result = outcome(fn -> m.repair_continuation(:bogus, [{:_, [], [:"$_"]}]) end)

      assert result ==
               if(m == :ets, do: {:raise, FunctionClauseError}, else: {:raise, ArgumentError})
    end
  end

  describe "15. to_dets/2 of objects the dets table cannot take" do
    contract "ETS: ErlangError; Heft: ArgumentError" do
      name = unique_name("heft_dets_keypos")
      file = Path.join(System.tmp_dir!(), "#{name}.dets")
      on_exit(fn -> File.rm(file) end)
      {:ok, ^name} = :dets.open_file(name, file: String.to_charlist(file), keypos: 3)
      tab = new_with(m, [{1, 2}])
      result = outcome(fn -> m.to_dets(tab, name) end)
      assert result == if(m == :ets, do: {:raise, ErlangError}, else: {:raise, ArgumentError})
      :dets.close(name)
    end
  end

  describe "16. info(tab, :binary)" do
    contract "ETS lists the refc binaries it holds; Heft holds none" do
      tab = new_with(m, {1, :binary.copy("x", 100)})
      binaries = m.info(tab, :binary)
      assert is_list(binaries)
      assert length(binaries) == if(m == :ets, do: 1, else: 0)
    end
  end
end
