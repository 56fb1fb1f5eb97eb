"The `defskill` macro, the one form a skill note needs.

The skill loader makes `defskill` available in every skill module; elsewhere
write `(require opencortex.skills.dsl [defskill])`."

(defmacro defskill [_hy_compiler name #* options]
  "Bind NAME to a skill built from the keyword OPTIONS.

  `(defskill greeter :trigger greeting? :priority 20 :description \"...\"
     :probabilistic (fn [ctx] ...) :deterministic (fn [action ctx] ...))`

  `:trigger` is required.  The skill records its name, the module it is
  defined in, and the file and line where this form stands; the options
  themselves are checked by `opencortex.skills.skill.define-skill`."
  (when (not (isinstance name hy.models.Symbol))
    (raise (TypeError (+ "defskill needs a name first, e.g. (defskill greeter :trigger greeting?); got "
                         (hy.repr name)))))
  (setv form _hy_compiler.this)
  `(setv ~name (hy.I.opencortex/skills/skill.define-skill
                 ~(str name) __name__ ~_hy_compiler.filename ~form.start-line
                 ~@options)))

;; What the skill loader hands to `hy.eval` as `:macros`.
(setv SKILL-MACROS {"defskill" (get-macro defskill)})
