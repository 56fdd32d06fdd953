defmodule Heft.Args do
  # Checks of public functions' arguments, so that every bad argument
  # raises ArgumentError naming it (as ETS raises badarg) before anything
  # is done, never a FunctionClauseError or CaseClauseError from inside
  # Heft.
  @moduledoc false

  # The longest time to live, in milliseconds (2^62: deadlines are
  # unsigned 64-bit milliseconds; about 146 million years).
  @max_ttl 4_611_686_018_427_387_904
  # The largest memory budget of a tiered arena, in bytes (2^62).
  @max_bytes 4_611_686_018_427_387_904

  @doc false
  # A table's `ttl:` (new/2, open/2): `nil`, `:infinity` (none) or
  # positive milliseconds.
  @spec table_ttl?(term) :: boolean
  def table_ttl?(t), do: t in [nil, :infinity] or (is_integer(t) and t > 0 and t <= @max_ttl)

  @doc false
  # A write's `ttl:` (insert/3, insert_new/3): `:table`, `:infinity` or
  # milliseconds, 0 included.
  @spec write_ttl?(term) :: boolean
  def write_ttl?(t), do: t in [:table, :infinity] or (is_integer(t) and t >= 0 and t <= @max_ttl)

  @doc false
  # The values `arena:` takes: `:memory`, `{:file, dir}`, `{:file, dir,
  # memory: bytes}` (a tiered arena).
  def arena?(:memory), do: true
  def arena?({:file, dir}), do: dir?(dir)

  def arena?({:file, dir, [memory: n]}),
    do: dir?(dir) and is_integer(n) and n > 0 and n <= @max_bytes

  def arena?(_), do: false

  defp dir?(dir), do: is_binary(dir) or is_list(dir)

  @doc false
  # `opts` if it is a proper list of `{key, value}` pairs with keys among
  # `allowed` (a keyword list of key => validity check); raises otherwise,
  # naming `fun` (as "Heft.insert/3") and the bad option.
  @spec options!(term, String.t(), [{atom, (term -> boolean)}]) :: keyword
  def options!(opts, fun, allowed) do
    unless proper_list?(opts) do
      raise ArgumentError, "#{fun} expects a list of options, got: #{inspect(opts)}"
    end

    for opt <- opts do
      case opt do
        {key, value} when is_atom(key) ->
          case List.keyfind(allowed, key, 0) do
            {^key, valid?} ->
              unless valid?.(value) do
                raise ArgumentError,
                      "#{fun}: option #{inspect(key)} has an invalid value: #{inspect(value)}"
              end

            nil ->
              raise ArgumentError, "#{fun}: unknown option #{inspect(opt)}"
          end

        _ ->
          raise ArgumentError, "#{fun}: unknown option #{inspect(opt)}"
      end
    end

    opts
  end

  @doc false
  @spec proper_list?(term) :: boolean
  def proper_list?([_ | t]), do: proper_list?(t)
  def proper_list?(l), do: l == []

  @doc false
  # A file name Heft can pass to the file system: a binary or a charlist
  # (chardata), as a string; raises otherwise.
  @spec filename!(term, String.t()) :: String.t()
  def filename!(name, fun) do
    if is_binary(name) or is_list(name) do
      try do
        IO.chardata_to_string(name)
      rescue
        _ in [ArgumentError, FunctionClauseError, UnicodeConversionError] ->
          bad_filename!(name, fun)
      end
    else
      bad_filename!(name, fun)
    end
  end

  defp bad_filename!(name, fun),
    do: raise(ArgumentError, "#{fun} expects a file name (a string), got: #{inspect(name)}")

  @doc false
  # The two-argument function of foldl/3 and foldr/3 as a chunk folder.
  # ETS calls the fun only on objects: with a fun of another arity an
  # empty table folds to the accumulator and only a non-empty one raises;
  # something that is not a fun at all raises at once.
  @spec folder(term, String.t()) :: ([tuple], term -> term)
  def folder(fun, _name) when is_function(fun, 2),
    do: fn records, acc -> List.foldl(records, acc, fun) end

  def folder(fun, name) when is_function(fun) do
    fn
      [], acc ->
        acc

      _records, _acc ->
        raise ArgumentError,
              "#{name} expects a function of two arguments (object, acc), got: #{inspect(fun)}"
    end
  end

  def folder(fun, name) do
    raise ArgumentError,
          "#{name} expects a function of two arguments (object, acc), got: #{inspect(fun)}"
  end
end
